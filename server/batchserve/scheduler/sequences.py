"""Triton's sequence batcher: stateful sequences whose steps share batches.

Every request to a model with ``sequence_batching`` names its sequence (a correlation id)
and whether it starts or ends it. The steps of one sequence run one at a time, in the order
they came; steps of different sequences share batches (the dynamic batcher underneath). Each
step's row gets the control inputs the config declares (START, END, READY, CORRID) and the
sequence's implicit state (``state { input_name output_name ... }``): the initial state on a
START step, else what the sequence's previous step output. State outputs are kept, not
answered. A sequence is forgotten after its END step, or after
``max_sequence_idle_microseconds`` with no request (counted as expired); a later request
for it without START is refused, as Triton refuses it. A client that cancels a step still
held (behind its sequence's running step, or in the backlog) cancels the whole sequence, as
in Triton: its other held steps are answered CANCELLED and it ends.

Both strategies hold a fixed number of candidate sequences per instance, as Triton's do:
``direct`` one per batch slot (``max_batch_size``), ``oldest`` ``max_candidate_sequences``.
Further sequences wait in an ordered backlog, their requests held, until a candidate ends
or expires; a backlogged sequence whose earliest request's timeout passes is dropped, every
request of it refused, as Triton's reaper does. The ready steps of the candidates share
batches: ``oldest`` under its queue delay and preferred sizes; ``direct`` at once, or,
with ``minimum_slot_utilization`` set, once that share of a batch's slots is ready or its
queue delay has passed. ``direct`` binding a sequence to one instance's slot matters only
to models that keep state inside an instance; implicit state is kept here, so any
instance runs any step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from batchserve.core.datatypes import from_config, from_numpy
from batchserve.core.errors import Cancelled, InvalidArgument, Overloaded, Unavailable
from batchserve.core.types import SequenceFlags
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig, ModelSequenceBatching
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.timing import TimerHandle
from batchserve.scheduler.work import Arrays, WorkItem

BACKLOG_TIMEOUT = (
    "timeout of the corresponding sequence has been expired (batchserve: the sequence waited "
    "for a free sequence slot past a request's timeout and was dropped; start it again)"
)
"""Triton's words first (its sequence batcher's reaper), which its QA tests read."""
SEQUENCE_CANCELLED = (
    "request cancelled (batchserve: another request of its sequence was cancelled, which "
    "cancels the whole sequence, as in Triton; start it again)"
)
DEFAULT_IDLE_US = 1_000_000
"""Triton's default ``max_sequence_idle_microseconds``."""
MAX_LIVE_SEQUENCES = 4096
"""Live sequences a model may hold at most; fewer when their state does not fit its memory
budget (the state of each is reserved on the host at load)."""

_KINDS = {
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}


@dataclass(frozen=True, slots=True)
class Control:
    """A control input the server fills: ``values`` are its (false, true) elements; a
    CORRID control carries the correlation id instead."""

    kind: str
    input: str
    dtype: np.dtype[np.generic]
    values: tuple[object, object] = (0, 1)


@dataclass(frozen=True, slots=True)
class State:
    """An implicit state: fed as ``input``, taken back from ``output`` after each step."""

    input: str
    output: str
    initial: np.ndarray
    """One row's state at START: zeros (Triton's ``zero_data``, and its default; a variable
    dimension 1), or its ``initial_state``'s data file."""


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    idle_ns: int
    slots_per_instance: int = 1
    """Candidate sequences per instance; more wait in the backlog."""
    batched: bool = True
    """False for a model without batching (``max_batch_size: 0``): its steps run one at a
    time, and its controls and state have no batch axis."""

    @classmethod
    def from_config(
        cls, config: ModelConfig, initial: Mapping[str, np.ndarray] | None = None
    ) -> SequencePolicy | None:
        """The config's ``sequence_batching``; None for a model without it. ``initial``:
        the initial states read from their data files, by state input name (zeros of
        their shape where not given)."""
        if config.WhichOneof("scheduling_choice") != "sequence_batching":
            return None
        batching = config.sequence_batching
        controls = [
            _control(control_input.name, control)
            for control_input in batching.control_input
            for control in control_input.control
        ]
        given = initial or {}
        states = [
            State(s.input_name, s.output_name,
                  given[s.input_name] if s.input_name in given else _zeros(s))
            for s in batching.state
        ]  # fmt: skip
        idle_us = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        return cls(
            tuple(controls), tuple(states), idle_us * 1000, candidate_slots(config),
            batched=config.max_batch_size > 0,
        )  # fmt: skip

    @property
    def state_bytes(self) -> int:
        """What one live sequence's state holds on the host (at START: a state of variable
        size holds what the model makes it)."""
        return sum(spec.initial.nbytes for spec in self.states)

    @property
    def corrid(self) -> Control | None:
        """The CORRID control, which takes the correlation id: as a number where its type is
        an integer, else as a string (Triton allows no other)."""
        return next((c for c in self.controls if c.kind == "CORRID"), None)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Outputs the server keeps, which clients do not get."""
        return tuple(s.output for s in self.states)

    def rows(self, flags: SequenceFlags, state: Arrays | None) -> Arrays:
        """One step's server-filled inputs: controls, and the state (None: the initial)."""
        arrays: Arrays = {}
        for control in self.controls:
            if control.kind == "CORRID":  # a client's id is of its kind (the batcher checks);
                # a generation loop's is a number, which a string control takes as text
                value: object = flags.id if control.dtype.kind in "iu" else str(flags.id)
            else:
                on = {"START": flags.start, "END": flags.end, "READY": True}[control.kind]
                value = control.values[on]
            arrays[control.input] = np.array([value], dtype=control.dtype)
        for spec in self.states:
            arrays[spec.input] = spec.initial if state is None else state[spec.input]
        return self._as_rows(arrays)

    def state_of(self, outputs: Arrays) -> Arrays:
        """A step's state, from its outputs (the step's row of them, where batched)."""
        return {s.input: outputs[s.output][0] if self.batched else outputs[s.output]
                for s in self.states}  # fmt: skip

    def _as_rows(self, arrays: Arrays) -> Arrays:
        """One step's arrays with the batch axis a batched model's inputs have."""
        if not self.batched:
            return arrays
        return {name: array[None, ...] for name, array in arrays.items()}

    def zeros(self, rows: int) -> Arrays:
        """Server-filled inputs for a synthetic batch (memory probe, warm-up): ``rows`` of
        them, or, for a model without batching, one step's."""
        arrays: Arrays = {}
        for control in self.controls:
            arrays[control.input] = np.zeros(1, dtype=control.dtype)
        for spec in self.states:
            arrays[spec.input] = spec.initial
        if not self.batched:
            return arrays
        return {name: np.repeat(array[None, ...], rows, axis=0) for name, array in arrays.items()}


def _zeros(state: ModelSequenceBatching.State) -> np.ndarray:
    """A state's zeros at START: of its ``initial_state``'s dims, or of its own with a
    variable dimension 1, as in Triton; from then on the state has the shape the model
    output for it."""
    dims: Iterable[int] = state.initial_state[0].dims if state.initial_state else state.dims
    shape = tuple(1 if dim == -1 else dim for dim in dims)
    return np.zeros(shape, from_config(state.data_type).numpy)


def filled_inputs(config: ModelConfig) -> frozenset[str]:
    """Inputs the sequence batcher fills (controls and states), which clients do not send;
    read from the config as written, so even controls it cannot use are known as such."""
    batching = config.sequence_batching
    return frozenset(
        [c.name for c in batching.control_input] + [s.input_name for s in batching.state]
    )


def candidate_slots(config: ModelConfig) -> int:
    """Candidate sequences per instance, as Triton counts them: one per batch slot, or the
    oldest strategy's ``max_candidate_sequences`` where set."""
    batching = config.sequence_batching
    if (
        batching.WhichOneof("strategy_choice") == "oldest"
        and batching.oldest.max_candidate_sequences > 0
    ):
        return batching.oldest.max_candidate_sequences
    return max(1, config.max_batch_size)


def _control(name: str, control: ModelSequenceBatching.Control) -> Control:
    kind = _KINDS[control.kind]
    if kind == "CORRID":
        return Control(kind, name, np.dtype(from_config(control.data_type).numpy))
    values: list[object]
    dtype: np.dtype[np.generic]
    if control.int32_false_true:
        dtype, values = np.dtype(np.int32), list(control.int32_false_true)
    elif control.fp32_false_true:
        dtype, values = np.dtype(np.float32), list(control.fp32_false_true)
    else:
        dtype, values = np.dtype(np.bool_), list(control.bool_false_true)
    return Control(kind, name, dtype, (values[0], values[1]))


@dataclass(eq=False)
class _Sequence:
    id: int | str
    pending: deque[WorkItem] = field(default_factory=deque)
    running: bool = False
    state: Arrays | None = None
    ending: bool = False
    """Its END request has come: only a new START may follow."""
    idle: asyncio.TimerHandle | None = None
    expires_ns: int | None = None
    """In the backlog: when its earliest request's timeout passes."""
    expiry: TimerHandle | None = None


class SequenceBatcher(Batcher):
    """A ``Batcher`` for a model with ``sequence_batching``: ``submit`` takes requests that
    name their sequence; each reaches the batch queue once its sequence's previous step
    has finished."""

    def __init__(
        self,
        model: str,
        pool: InstancePool,
        policy: BatchPolicy,
        stats: ModelStats,
        sequences: SequencePolicy,
        *,
        max_live: int = MAX_LIVE_SEQUENCES,
        pad_value: float = 0,
        inline_below_ns: int = 0,
    ) -> None:
        super().__init__(pool, policy, stats, pad_value=pad_value, inline_below_ns=inline_below_ns)
        self.model = model
        self.sequences = sequences
        self.max_live = max_live
        """Live sequences at most (from the memory budget): a START beyond is refused."""
        self.max_candidates = sequences.slots_per_instance * max(1, len(pool.instances))
        """Sequences whose steps may run; later ones wait in the backlog."""
        self._live: dict[int | str, _Sequence] = {}
        self._slotted: set[_Sequence] = set()
        """The candidate sequences, whose steps may run (the others wait in the backlog), a
        replaced one (a START for an id whose sequence was still ending) included until it
        ends."""
        self._backlog: deque[_Sequence] = deque()

    @property
    def live(self) -> int:
        """Sequences started and neither ended nor expired, the backlog included."""
        return len(self._live)

    @property
    def backlog(self) -> int:
        """Sequences waiting for a candidate slot."""
        return len(self._backlog)

    def pending_requests(self) -> int:
        """The queue's, and the steps held behind their sequence's previous step or in the
        backlog: Triton counts those waiting in its sequence batcher too."""
        held = sum(len(sequence.pending) for sequence in (*self._slotted, *self._backlog))
        return super().pending_requests() + held

    def _hold_reached(self, queued: int) -> bool:
        """Triton's count for its sequence batcher's hold: the requests of sequences with a
        slot (queued, or held behind their previous step), and, with ``hold_backlog``, those
        of the backlog's sequences."""
        in_slots = sum(len(sequence.pending) for sequence in self._slotted)
        if Batcher.pending_requests(self) + in_slots < queued:
            return False
        backlogged = sum(len(sequence.pending) for sequence in self._backlog)
        return backlogged >= self.policy.hold_backlog

    def submit(self, item: WorkItem) -> None:
        flags = self._flags(item)
        sequence = self._live.get(flags.id)
        if sequence is None or sequence.ending:  # unknown, ended, expired, or ending
            if not flags.start:
                raise InvalidArgument(
                    f"inference request for sequence {flags.id} to model '{self.model}' must "
                    "specify the START flag on the first request of the sequence"
                )
            if sequence is None and len(self._live) >= self.max_live:
                raise Overloaded(
                    f"model '{self.model}' holds {self.max_live} live sequences, the most its "
                    "memory budget allows for their state: end sequences (sequence_end) or "
                    "let idle ones expire, then retry"
                )
            sequence = self._live[flags.id] = _Sequence(flags.id)
            self._admit(sequence)
        if sequence.idle is not None:
            sequence.idle.cancel()
            sequence.idle = None
        sequence.ending = flags.end
        sequence.pending.append(item)
        item.future.add_done_callback(partial(self._left, sequence, item))
        if sequence not in self._slotted:
            self._watch_backlog(sequence, item.deadline_ns)
        elif not sequence.running:
            self._next(sequence)
        self._counted_toward_hold()

    def _left(self, sequence: _Sequence, item: WorkItem, future: asyncio.Future[Arrays]) -> None:
        """A held step's client left: as in Triton, cancelling any queued request of a
        sequence cancels the whole sequence. Its other held steps are answered cancelled,
        and it ends (only a new START may follow) once the step running now, if any, is
        done; a backlogged sequence leaves the backlog."""
        if not future.cancelled() or item not in sequence.pending:
            return  # answered, or already running (the batcher stops a queued step)
        sequence.pending.remove(item)
        self._cancel_rest(sequence)
        if sequence.running:
            return  # _next forgets it after the running step
        if sequence in self._backlog:
            self._backlog.remove(sequence)
            if sequence.expiry is not None:
                sequence.expiry.cancel()
                sequence.expiry = None
        self._forget(sequence)

    @staticmethod
    def _cancel_rest(sequence: _Sequence) -> None:
        """Answer the sequence's held steps cancelled, and end it (only a START may follow)."""
        while sequence.pending:
            sequence.pending.popleft().finish(Cancelled(SEQUENCE_CANCELLED))
        sequence.ending = True

    def _watch_backlog(self, sequence: _Sequence, deadline_ns: int | None) -> None:
        """Drop the backlogged sequence once the earliest of its requests' timeouts passes
        (Triton's backlog expiration); the timeout of a queued step is the batcher's."""
        if deadline_ns is None or (
            sequence.expires_ns is not None and sequence.expires_ns <= deadline_ns
        ):
            return
        if sequence.expiry is not None:
            sequence.expiry.cancel()
        sequence.expires_ns = deadline_ns
        sequence.expiry = self._timer.call_at(deadline_ns, partial(self._drop_backlog, sequence))

    def _drop_backlog(self, sequence: _Sequence) -> None:
        sequence.expiry = None
        if sequence in self._slotted or sequence not in self._backlog:
            return
        self._backlog.remove(sequence)
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]
        while sequence.pending:
            sequence.pending.popleft().finish(Unavailable(BACKLOG_TIMEOUT))

    def _admit(self, sequence: _Sequence) -> None:
        """Make a new sequence a candidate, or queue it in the backlog when none is free."""
        if len(self._slotted) < self.max_candidates:
            self._slotted.add(sequence)
        else:
            self._backlog.append(sequence)

    def submit_held(self, item: WorkItem) -> None:
        """Queue steps of sequences whose state the caller holds (a generation loop): every
        input, controls and state included, is in ``item``, and the state outputs come back
        to the caller. They batch with the other sequences' steps."""
        Batcher.submit(self, item)

    def _flags(self, item: WorkItem) -> SequenceFlags:
        flags = item.sequence
        if flags is None:
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        if item.batch_size != 1:
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify batch-size 1 due "
                "to requirements of sequence batcher"
            )
        corrid = self.sequences.corrid
        if corrid is not None and isinstance(flags.id, str) == (corrid.dtype.kind in "iu"):
            sent, wanted = (
                ("BYTES", "an integer") if isinstance(flags.id, str) else ("UINT64", "a string")
            )
            raise InvalidArgument(  # Triton's words (infer_request.cc), then ours
                f"sequence batching control '{corrid.input}' data-type is '{sent}', but model "
                f"'{self.model}' expects '{from_numpy(corrid.dtype).wire}' (batchserve: send "
                f"{wanted} sequence_id)"
            )
        return flags

    def _next(self, sequence: _Sequence) -> None:
        """Queue the sequence's next step, or, with none waiting, let it idle or go."""
        while sequence.pending:
            item = sequence.pending.popleft()
            if item.abandoned():  # its client left before it ran: as in _left
                item.finish(asyncio.CancelledError())
                self._cancel_rest(sequence)
                continue
            flags = item.sequence
            assert flags is not None  # checked by submit
            state = None if flags.start else sequence.state
            step = WorkItem(
                inputs={**item.inputs, **self.sequences.rows(flags, state)},
                batch_size=1,
                output_names=item.output_names + self.sequences.output_names,
                priority=item.priority,
                enqueued_ns=item.enqueued_ns,
                deadline_ns=item.deadline_ns,
                future=asyncio.get_running_loop().create_future(),
                is_cancelled=item.abandoned,
            )
            try:
                super().submit(step)
            except Exception as exc:  # full queue, unloading: this step fails, not the rest
                item.finish(exc)
                continue
            sequence.running = True
            step.future.add_done_callback(partial(self._stepped, sequence, item, step))
            return
        sequence.running = False
        if sequence.ending:
            self._forget(sequence)
        else:
            loop = asyncio.get_running_loop()
            sequence.idle = loop.call_later(self.sequences.idle_ns / 1e9, self._expire, sequence)

    def _stepped(
        self, sequence: _Sequence, item: WorkItem, run: WorkItem, step: asyncio.Future[Arrays]
    ) -> None:
        item.dispatched_ns = run.dispatched_ns  # its queue time is the step's
        item.compute_ns = run.compute_ns
        if step.cancelled():
            item.finish(asyncio.CancelledError())
        elif (error := step.exception()) is not None:
            item.finish(error)
        else:
            outputs = step.result()
            sequence.state = self.sequences.state_of(outputs)
            item.finish({name: outputs[name] for name in item.output_names})
        self._next(sequence)

    def _expire(self, sequence: _Sequence) -> None:
        sequence.idle = None
        if not sequence.running and not sequence.pending:
            self._forget(sequence)
            self.stats.sequences_expired += 1

    def _forget(self, sequence: _Sequence) -> None:
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]
        self._slotted.discard(sequence)
        while self._backlog and len(self._slotted) < self.max_candidates:
            promoted = self._backlog.popleft()
            if promoted.expiry is not None:  # its steps' timeouts are the batcher's now
                promoted.expiry.cancel()
                promoted.expiry = None
            self._slotted.add(promoted)
            self._next(promoted)

    async def close(self) -> None:
        for sequence in [*self._live.values(), *self._backlog]:
            for timer in (sequence.idle, sequence.expiry):
                if timer is not None:
                    timer.cancel()
        while self._backlog:  # never reached a slot: answer rather than strand them
            for item in self._backlog.popleft().pending:
                item.finish(Unavailable("model was unloaded"))
        self._live.clear()
        await super().close()
