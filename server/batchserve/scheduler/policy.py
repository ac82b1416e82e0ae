"""Scheduling policy of one model, read once from its ModelConfig."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from math import ceil
from typing import NamedTuple

from batchserve.proto.model_config_pb2 import (
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelOutput,
    ModelQueuePolicy,
)
from batchserve.scheduler.batch_io import BatchIO

MS = 1_000_000
ANY_LEVEL = 2**64 - 1
"""An ensemble's priority levels: it queues nothing, and its steps get the priority its
request named (0: each composing model's default), as in Triton."""
AxisOf = tuple[tuple[str, int], ...]
"""(tensor name, axis) pairs, the axis counted with the batch axis as 0."""
AxesOf = tuple[tuple[str, tuple[int, ...]], ...]
"""(tensor name, axes) pairs: the axes whose product is a row's positions."""


class LevelPolicy(NamedTuple):
    """Triton's ``priority_queue_policy`` entry of one priority level, in place of the
    default queue policy for its requests: their timeout, whether they may ask for a
    shorter one, how many of them may wait (0: only the model's queue bound), and whether
    a timed-out one is delayed (``timeout_action: DELAY``) rather than refused."""

    timeout_ns: int
    allow_timeout_override: bool
    max_size: int
    delays: bool = False


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How requests of one model are queued and grouped.

    Args:
        max_batch_size: samples per batch; 0 means the model takes no batch axis.
        merge_requests: dynamic batching is on (several requests share a batch).
        preferred_batch_sizes: dispatch at once when a batch reaches one of these.
        max_queue_delay_ns: longest a request waits for company; 0 is greedy.
        max_queue_size: requests queued (all levels) before new ones are refused.
        priority_levels: number of levels, 1 the highest.
        default_priority: level of requests that name none.
        default_timeout_ns: queue timeout of requests that name none; 0 for none.
        allow_timeout_override: requests may ask for a shorter timeout.
        default_delays: a request past its timeout is delayed, not refused (Triton's
            ``timeout_action: DELAY``; ``queue.py``).
        level_policies: the levels with a queue policy of their own, by level.
        aging_ns: a request queued this long is served as if it were top priority.
        preserve_ordering: requests complete in the order they were submitted.
        sequence_inputs: for a model naming ``batchserve.sequence_length_input``, the
            sequence axis of each other input with one (its first dynamic axis); requests
            are grouped by their length on it.
        sequence_outputs: likewise for outputs: each request's rows are cut back to its own
            length on that axis.
        length_input: that input's name, when the sequence axes are known ("" otherwise).
        position_inputs: for a batched model with free (-1) non-batch axes, each input's
            free axes (a sequence model's: its sequence axis alone); a row's positions are
            the largest product of their sizes over the inputs (``padding.row_positions``).
        max_batch_steps: the positions (rows times a row's positions, padded) a batch may
            hold, derived from its memory budget: a sequence model's steps, an image's
            pixels; 0: batches are counted in rows alone.
        length_buckets: requests of a sequence model are cut into batches by length
            (``length_buckets.py``); False pads each batch to its longest, in queue order.
        step_cost_rows: the configured cost of a sequence step in rows; 0 to learn it.
        latency_objective_ns: a request's end-to-end objective (0: none). A forming batch
            then waits for company only while its oldest request can still finish within
            it, given the predicted time of the batch (``batch_time.py``).
        refuse_late: with an objective, a request that can no longer meet it is refused
            at once instead of served late.
        batch_io: for a model with ragged inputs, batch inputs or batch outputs, how its
            batches are made and taken apart (``batch_io.py``); None otherwise.
        wait_out_queue_delay: a batch short of a preferred size waits the whole delay, as
            in Triton, rather than going once no company can be expected
            (``dispatch_timing.py``).
        hold_first_batch: for testing, as Triton's ``TRITONSERVER_DELAY_SCHEDULER``: the
            batcher dispatches nothing until this many requests are queued, once, so that a
            test's requests are all queued before the first batch forms (0: no hold).
        hold_backlog: with ``hold_first_batch``, for a sequence model, as Triton's
            ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``: the hold also lasts until this many
            requests wait in the backlog (sequences without a slot yet).
    """

    max_batch_size: int
    merge_requests: bool
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    max_queue_size: int = 1024
    priority_levels: int = 1
    default_priority: int = 1
    default_timeout_ns: int = 0
    allow_timeout_override: bool = True
    default_delays: bool = False
    level_policies: tuple[tuple[int, LevelPolicy], ...] = ()
    aging_ns: int = 10 * MS
    preserve_ordering: bool = False
    sequence_inputs: AxisOf = ()
    sequence_outputs: AxisOf = ()
    length_input: str = ""
    position_inputs: AxesOf = ()
    max_batch_steps: int = 0
    length_buckets: bool = True
    step_cost_rows: float = 0.0
    latency_objective_ns: int = 0
    refuse_late: bool = False
    batch_io: BatchIO | None = None
    wait_out_queue_delay: bool = False
    hold_first_batch: int = 0
    hold_backlog: int = 0

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        server_max_queue_size: int,
        wait_out_queue_delay: bool = False,
        *,
        delay_scheduler: int = 0,
        backlog_delay_scheduler: int = 0,
    ) -> BatchPolicy:
        """Triton's fields; a model without dynamic_batching runs each request alone (but
        for sequence_batching: its steps of different sequences share batches).
        ``wait_out_queue_delay``: the server's ``--wait-out-queue-delay``, which the
        config's own field turns on for one model. ``delay_scheduler``: the server's
        ``--delay-scheduler``, held by the batchers of dynamic and sequence batching, as
        Triton holds them; ``backlog_delay_scheduler``: ``--backlog-delay-scheduler``, a
        sequence model's backlog's part of that hold."""
        objective_ns = config.batchserve.latency_objective_microseconds * 1000
        refuse_late = config.batchserve.refuse_late_requests
        batch_io = BatchIO.from_config(config)
        wait_out = wait_out_queue_delay or config.batchserve.wait_out_queue_delay
        if config.HasField("sequence_batching"):
            steps = cls._sequence_steps(config, server_max_queue_size)
            return replace(steps, latency_objective_ns=objective_ns, refuse_late=refuse_late,
                           batch_io=batch_io, wait_out_queue_delay=wait_out,
                           hold_first_batch=delay_scheduler,
                           hold_backlog=backlog_delay_scheduler)  # fmt: skip
        sequence_axes = _position_layout(config)
        if config.HasField("ensemble_scheduling"):  # Triton's: any priority passes through
            return replace(sequence_axes, max_batch_size=config.max_batch_size,
                           merge_requests=False, max_queue_size=server_max_queue_size,
                           priority_levels=ANY_LEVEL, default_priority=0)  # fmt: skip
        if not config.HasField("dynamic_batching"):
            return replace(sequence_axes, max_batch_size=config.max_batch_size,
                           merge_requests=False, max_queue_size=server_max_queue_size,
                           latency_objective_ns=objective_ns, refuse_late=refuse_late,
                           batch_io=batch_io)  # fmt: skip
        batching = config.dynamic_batching
        queue = batching.default_queue_policy
        levels = max(1, batching.priority_levels)
        delay_ns = batching.max_queue_delay_microseconds * 1000
        return replace(
            sequence_axes,
            max_batch_size=config.max_batch_size,
            merge_requests=config.max_batch_size > 0,
            preferred_batch_sizes=tuple(sorted(batching.preferred_batch_size)),
            max_queue_delay_ns=delay_ns,
            max_queue_size=queue.max_queue_size or server_max_queue_size,
            priority_levels=levels,
            default_priority=batching.default_priority_level or levels,
            default_timeout_ns=queue.default_timeout_microseconds * 1000,
            allow_timeout_override=queue.allow_timeout_override
            or not queue.default_timeout_microseconds,
            default_delays=queue.timeout_action == ModelQueuePolicy.DELAY,
            level_policies=_level_policies(batching),
            aging_ns=10 * max(delay_ns, MS),
            preserve_ordering=batching.preserve_ordering,
            length_buckets=not config.batchserve.length_buckets.disabled,
            step_cost_rows=config.batchserve.length_buckets.step_cost_rows,
            latency_objective_ns=objective_ns,
            refuse_late=refuse_late,
            batch_io=batch_io,
            wait_out_queue_delay=wait_out,
            hold_first_batch=delay_scheduler,
        )

    @property
    def delays_any(self) -> bool:
        """Some level delays timed-out requests: the queue has them to move."""
        return self.default_delays or any(own.delays for _, own in self.level_policies)

    def queue_policy(self, priority: int) -> LevelPolicy:
        """The queue policy of a level: its own, or the default one."""
        for level, own in self.level_policies:
            if level == priority:
                return own
        return LevelPolicy(
            self.default_timeout_ns, self.allow_timeout_override, 0, self.default_delays
        )

    @classmethod
    def _sequence_steps(cls, config: ModelConfig, server_max_queue_size: int) -> BatchPolicy:
        """A sequence model's steps batch as requests do, under its strategy's delay: the
        oldest strategy's delay and preferred sizes; for ``direct``, its delay only with a
        ``minimum_slot_utilization``, whose share of the slots then sends a batch at once."""
        batching = config.sequence_batching
        if batching.WhichOneof("strategy_choice") == "oldest":
            delay_ns = batching.oldest.max_queue_delay_microseconds * 1000
            preferred = tuple(sorted(batching.oldest.preferred_batch_size))
        elif (ready := direct_ready_rows(config)) > 0:
            delay_ns = batching.direct.max_queue_delay_microseconds * 1000
            preferred = tuple(range(ready, config.max_batch_size + 1))
        else:
            delay_ns, preferred = 0, ()
        return cls(
            max_batch_size=config.max_batch_size,
            merge_requests=config.max_batch_size > 0,
            preferred_batch_sizes=preferred,
            max_queue_delay_ns=delay_ns,
            max_queue_size=server_max_queue_size,
            aging_ns=10 * max(delay_ns, MS),
        )


def _level_policies(batching: ModelDynamicBatching) -> tuple[tuple[int, LevelPolicy], ...]:
    """Each ``priority_queue_policy`` entry, as the level's ``LevelPolicy``; none without
    ``priority_levels``, as Triton then has no levels for them to apply to."""
    if not batching.priority_levels:
        return ()
    return tuple(
        (level, LevelPolicy(
            queue.default_timeout_microseconds * 1000,
            queue.allow_timeout_override or not queue.default_timeout_microseconds,
            queue.max_queue_size,
            queue.timeout_action == ModelQueuePolicy.DELAY,
        ))
        for level, queue in sorted(batching.priority_queue_policy.items())
    )  # fmt: skip


def _position_layout(config: ModelConfig) -> BatchPolicy:
    """A policy with only the position axes of a batched model: a sequence model's
    sequence axes (its requests' lengths are checked and its batches bounded in steps, with
    or without dynamic batching), or any other model's free non-batch axes (its batches
    bounded in positions where its memory budget counts them: ``memory.StepBudget``)."""
    length_input = config.batchserve.sequence_length_input
    plain = BatchPolicy(max_batch_size=config.max_batch_size, merge_requests=False)
    if config.max_batch_size <= 0:
        return plain
    if not length_input:
        return replace(plain, position_inputs=free_axes(config.input))
    sequence_inputs = _sequence_axes(config.input, length_input)
    return replace(
        plain,
        sequence_inputs=sequence_inputs,
        sequence_outputs=_sequence_axes(config.output, length_input),
        length_input=length_input,
        position_inputs=tuple((name, (axis,)) for name, axis in sequence_inputs),
    )


def free_axes(inputs: Iterable[ModelInput]) -> AxesOf:
    """Each input's free (-1) non-batch axes, counted with the batch axis as 0."""
    found = []
    for tensor in inputs:
        axes = tuple(axis + 1 for axis, dim in enumerate(tensor.dims) if dim < 0)
        if axes:
            found.append((tensor.name, axes))
    return tuple(found)


def direct_ready_rows(config: ModelConfig) -> int:
    """Ready steps that send a ``direct`` batch before its queue delay: the share
    ``minimum_slot_utilization`` of its slots; 0 when unset (the delay is then ignored)."""
    utilization = config.sequence_batching.direct.minimum_slot_utilization
    return ceil(utilization * max(1, config.max_batch_size)) if utilization > 0 else 0


def _sequence_axes(tensors: Iterable[ModelInput | ModelOutput], length_input: str) -> AxisOf:
    return tuple(
        (tensor.name, list(tensor.dims).index(-1) + 1)
        for tensor in tensors
        if tensor.name != length_input and -1 in tensor.dims
    )
