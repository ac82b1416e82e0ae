"""An ensemble's scheduler: each request runs through the composing models' own batchers.

A step is a request to its composing model like any client's: validated against that
model's config, queued by its batcher (so concurrent ensemble requests batch there with
each other and with direct clients), and counted in that model's statistics. A step starts
as soon as the tensors it reads are written, so independent steps run at once. Tensors pass
between steps as the arrays the steps returned, never copied; Triton's one reshape rule
between a batching and a non-batching model is applied (``_fitted``). Errors come back in
Triton's words, prefixed "in ensemble '<name>', ".
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from batchserve.backends.reshape import Shapes, reshaped, reshapes
from batchserve.core.datatypes import DataType, from_config
from batchserve.core.errors import BatchserveError, InvalidArgument, Unavailable
from batchserve.core.types import RequestedOutput, Tensor
from batchserve.core.validation import validate_request
from batchserve.models import admission
from batchserve.models.ensemble_config import EnsembleStep, ensemble_steps, needed_steps
from batchserve.models.model_table import ServedVersion
from batchserve.observability import trace_records
from batchserve.observability.stats import ModelStats
from batchserve.observability.trace_records import StepTrace
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.sequences import SequenceBatcher
from batchserve.scheduler.work import Arrays, WorkItem

logger = logging.getLogger(__name__)

PRUNED_KEPT = 64
"""Sets of asked-for outputs whose steps are kept worked out (each set a few steps)."""

Lookup = Callable[[str, str], ServedVersion]
"""A composing model's version as served now, by name and version ("" for its latest);
raises as a client's request would (not found, not ready)."""


@dataclass(frozen=True, slots=True)
class Value:
    """An ensemble tensor once written: its type, elements, and the batch it holds (0 when
    written by a model that does not batch)."""

    datatype: DataType
    data: np.ndarray
    batch_size: int


Values = dict[str, Value | None]
"""The ensemble's tensors written so far (None: an optional input the request left out)."""


@dataclass(frozen=True, slots=True)
class StepDone:
    outputs: Mapping[str, Value]
    compute_ns: int


class EnsembleBatcher(Batcher):
    """Runs each request through the ensemble's steps; it holds no instances of its own."""

    def __init__(
        self, config: ModelConfig, policy: BatchPolicy, stats: ModelStats, lookup: Lookup
    ) -> None:
        super().__init__(InstancePool([]), policy, stats)
        self.name = config.name
        self.steps = ensemble_steps(config)
        self._lookup = lookup
        self._batching = config.max_batch_size > 0
        self._input_types = {spec.name: from_config(spec.data_type) for spec in config.input}
        self._output_dims = {
            spec.name: tuple(spec.reshape.shape if spec.HasField("reshape") else spec.dims)
            for spec in config.output
        }
        self._reshapes = reshapes(config)
        """The ensemble's own ``reshape``s: its steps see an input as reshaped, and clients
        get an output back in its dims, as from any model."""
        limit = config.ensemble_scheduling.max_inflight_requests
        self._inflight = {step: asyncio.Semaphore(limit) for step in self.steps} if limit else {}
        """Triton's ``max_inflight_requests``: requests each step holds at once across the
        ensemble's requests (none: no limit); a step past it waits for room."""
        if limit:  # Triton's line, which its backpressure tests look for in the log
            logger.info(
                "Ensemble model '%s' configured with max_inflight_requests: %d", self.name, limit
            )
        self._pruned: dict[frozenset[str], tuple[EnsembleStep, ...]] = {}
        """The steps a request runs, by the outputs it asks for: a few sets in practice,
        and never more than ``PRUNED_KEPT`` (clients choose them)."""

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self._output_dims)

    def steps_take_sequences(self) -> bool:
        """Whether a step's model batches sequences (or is an ensemble one of whose does):
        a request's sequence parameters then go to those steps."""
        for step in self.steps:
            try:
                served = self._lookup(step.model, step.version)
            except BatchserveError:
                continue  # (being reloaded: its requests fail in their own words)
            if takes_sequences(served.batcher):
                return True
        return False

    def submit(self, item: WorkItem) -> None:
        if self._closed:
            raise Unavailable("model is being unloaded")
        item.dispatched_ns = time.monotonic_ns()  # an ensemble queues nothing of its own
        trace_records.mark_composite()
        task = asyncio.get_running_loop().create_task(self._run(item))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        item.future.add_done_callback(partial(_stop_when_cancelled, task))

    async def _run(self, item: WorkItem) -> None:
        """Answer ``item``: its outputs, or its step's error after the ensemble's name."""
        try:
            outputs = await self._outputs(item)
        except asyncio.CancelledError:
            item.finish(asyncio.CancelledError())
            raise
        except Exception as exc:
            item.finish(in_ensemble(self.name, exc))
            return
        item.finish(outputs)

    async def _outputs(self, item: WorkItem) -> Arrays:
        values = self.start_values(item)
        compute_ns = await self._steps(item, self.steps_for(item), values)
        outputs = self.outputs_of(values, item.output_names)
        _record_executions(self.stats, item, compute_ns)
        return outputs

    def start_values(self, item: WorkItem) -> Values:
        """The ensemble's tensors as ``item`` writes them: its inputs (reshaped as the
        ensemble's config says), and None for an optional one it left out (the steps
        reading it then go without it, as in Triton: their own input must be optional)."""
        batch = item.batch_size if self._batching else 0
        into, _ = self._reshapes
        values: Values = dict.fromkeys(self._input_types)
        values.update(
            (name, Value(self._input_types[name], self._shaped(into, name, array), batch))
            for name, array in item.inputs.items()
        )
        return values

    def steps_for(self, item: WorkItem) -> tuple[EnsembleStep, ...]:
        """The steps that write what ``item`` asks for (Triton prunes the others)."""
        asked = frozenset(item.output_names)
        steps = self._pruned.get(asked)
        if steps is None:
            if len(self._pruned) >= PRUNED_KEPT:
                self._pruned.clear()
            steps = self._pruned[asked] = needed_steps(self.steps, asked)
        return steps

    def outputs_of(self, values: Values, names: tuple[str, ...]) -> Arrays:
        """The outputs ``names`` from the written tensors, shaped for the client; Triton's
        deadlock error when one is not written."""
        written = {name: values.get(name) for name in names}
        missing = [name for name, value in written.items() if value is None]
        if missing:
            raise InvalidArgument(
                "unexpected deadlock, at least one output is not set while no more "
                f"ensemble steps can be made (batchserve: {', '.join(missing)} not written)"
            )
        _, back = self._reshapes
        return {
            name: self._shaped(back, name, _fitted(value, self._output_dims[name], self._batching))
            for name, value in written.items()
            if value is not None
        }

    def _shaped(self, shapes: Shapes, name: str, array: np.ndarray) -> np.ndarray:
        if name not in shapes:
            return array
        return reshaped(array, shapes[name], self._batching, f"ensemble tensor '{name}'")

    async def _steps(self, item: WorkItem, steps: tuple[EnsembleStep, ...], values: Values) -> int:
        """Run each step once its inputs are written; the steps' compute time in all."""
        waiting = list(steps)
        running: set[asyncio.Task[StepDone]] = set()
        compute_ns = 0
        try:
            while waiting or running:
                for step in [s for s in waiting if all(t in values for t in s.needs)]:
                    waiting.remove(step)
                    running.add(asyncio.ensure_future(self.run_step(step, item, values)))
                if not running:
                    break  # the rest read tensors nothing writes: answered as a deadlock
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    finished = task.result()
                    values.update(finished.outputs)
                    compute_ns += finished.compute_ns
        finally:
            for task in running:
                task.cancel()
        return compute_ns

    async def run_step(self, step: EnsembleStep, item: WorkItem, values: Values) -> StepDone:
        limit = self._inflight.get(step)
        if limit is None:
            return await self._run_step(step, item, values)
        async with limit:
            return await self._run_step(step, item, values)

    def inflight_limit(self, step: EnsembleStep) -> asyncio.Semaphore | None:
        """``max_inflight_requests``' hold on ``step``, if set."""
        return self._inflight.get(step)

    def composing(self, step: EnsembleStep) -> ServedVersion:
        return self._lookup(step.model, step.version)

    async def _run_step(self, step: EnsembleStep, item: WorkItem, values: Values) -> StepDone:
        served = self._lookup(step.model, step.version)
        batching = served.config.max_batch_size > 0
        tensors, wanted = step_request(step, served, values)
        traced = trace_records.step_of(served.name, str(served.version))  # starts before queued
        started = time.monotonic_ns()
        served.stats.received += item.clients
        arrays: Arrays = {}
        try:
            valid = validate_request(tensors, wanted, served.schema)
            work = admission.work_item(
                served, valid, item.priority, step_timeout_us(item), started,
                item.is_cancelled,
            )  # fmt: skip
            work.clients = item.clients
            # as Triton's ensemble passes them: a model that does not batch sequences
            # ignores them there (a client sending them to it directly is refused)
            work.sequence = item.sequence if takes_sequences(served.batcher) else None
            if traced is None:
                served.batcher.submit(work)
            else:
                _submit_traced(served, work, traced)
            try:
                arrays = await work.future
            except asyncio.CancelledError:
                work.future.cancel()
                raise
        except BaseException as exc:
            admission.record_failure(served, started, exc, "", "", item.clients)
            raise
        finally:
            if traced is not None:
                traced.done(tensors, step_outputs(served, arrays) if traced.tensors else ())
        admission.record_success(served, started, work, "", item.clients)
        types = served.output_types
        batch = valid.batch_size if batching else 0
        outputs = {
            tensor: Value(types[model_output], arrays[model_output], batch)
            for model_output, tensor in step.outputs
        }
        return StepDone(outputs, time.monotonic_ns() - (work.dispatched_ns or started))


def step_request(
    step: EnsembleStep, served: ServedVersion, values: Values
) -> tuple[list[Tensor], list[RequestedOutput]]:
    """A step's request to its model: the tensors it reads, fitted to the model's batching,
    and the outputs it writes."""
    batching = served.config.max_batch_size > 0
    dims = {spec.name: tuple(spec.dims) for spec in served.config.input}
    tensors = []
    for model_input, tensor in step.inputs:
        value = values[tensor]
        if value is None:
            continue  # an optional input the request left out
        data = _fitted(value, dims.get(model_input, ()), batching)
        tensors.append(Tensor(model_input, value.datatype, data.shape, data))
    return tensors, [RequestedOutput(model_output) for model_output, _ in step.outputs]


def _submit_traced(served: ServedVersion, work: WorkItem, traced: StepTrace) -> None:
    """Submit a traced step: its trace is current meanwhile, so that a
    nested ensemble's steps are traced under it."""
    traced.queued(work)
    token = trace_records.enter_step(traced)
    try:
        served.batcher.submit(work)
    finally:
        trace_records.leave_step(token)


def step_outputs(served: ServedVersion, arrays: Arrays) -> list[Tensor]:
    types = served.output_types
    return [Tensor(name, types[name], array.shape, array) for name, array in arrays.items()]


def step_timeout_us(item: WorkItem) -> int:
    """The timeout the ensemble's request named (0: none), which each step's request
    carries as Triton's ensemble passes it on: a limit on a step's wait in its model's
    queue, under that queue's policy (refused or delayed past it)."""
    if item.deadline_ns is None:
        return 0
    return max(1, (item.deadline_ns - item.enqueued_ns) // 1000)


def takes_sequences(batcher: Batcher) -> bool:
    """Whether requests to this batcher's model may carry sequence parameters: its model
    batches sequences, or it is an ensemble with a step that does (Triton passes them to
    every step)."""
    if isinstance(batcher, SequenceBatcher):
        return True
    return isinstance(batcher, EnsembleBatcher) and batcher.steps_take_sequences()


def _record_executions(stats: ModelStats, item: WorkItem, compute_ns: int) -> None:
    """Triton counts an ensemble's request as one execution of its batch, whose compute is
    its steps'; a worker's group of requests (``item.clients``) counts each member's, their
    samples shared out as evenly as the group's total allows."""
    clients = item.clients
    total = max(clients, item.batch_size)
    for member in range(clients):
        size = total // clients + (1 if member < total % clients else 0)
        stats.record_batch(size, 0, compute_ns, 0)
    stats.record_compute(clients, 0, compute_ns, 0)


def _fitted(value: Value, config_dims: tuple[int, ...], batching: bool) -> np.ndarray:
    """Triton's ``ReshapeTensorDims``: a tensor from a model that does not batch gains a
    batch of 1 for one that does, where its shape is the input's own; one of a batch of 1
    loses the batch for a model that does not batch, where its shape is not the input's."""
    data = value.data
    if batching == (value.batch_size != 0):
        return data
    shape = tuple(data.shape)
    if batching:
        return data.reshape((1, *shape)) if _agree(config_dims, shape) else data
    if not _agree(config_dims, shape) and value.batch_size == 1:
        return data.reshape(shape[1:])
    return data


def _agree(config_dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(config_dims) == len(shape) and all(
        d == -1 or d == s for d, s in zip(config_dims, shape, strict=True)
    )


def in_ensemble(name: str, error: Exception) -> Exception:
    """A step's error as Triton's ensemble reports it: its message after the ensemble's."""
    if not isinstance(error, BatchserveError):
        return error
    prefixed = copy.copy(error)
    prefixed.message = f"in ensemble '{name}', {error.message}"
    prefixed.args = (prefixed.message,)
    return prefixed


def _stop_when_cancelled(task: asyncio.Task[None], future: asyncio.Future[Arrays]) -> None:
    """The client went away (its future cancelled): stop the steps still waiting."""
    if future.cancelled() and not task.done():
        with contextlib.suppress(RuntimeError):
            task.cancel()
