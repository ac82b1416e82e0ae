"""A traced request as Triton's trace-file records, which its ``trace_summary.py`` reads.

Triton writes each trace as JSON objects that share its ``id``: one naming the model
(``model_name``, ``model_version``, ``request_id`` where the request had one, ``parent_id``
for an ensemble's step), one per timestamp (``{"id", "timestamps": [{"name", "ns"}]}``, on
the monotonic clock), and at level TENSORS one per tensor (``activity``
``TENSOR_QUEUE_INPUT`` or ``TENSOR_BACKEND_OUTPUT``; ``tensor`` with ``name``, ``data`` as
comma-separated values, ``shape`` and ``dtype``).

The timestamps, from the request path's marks and the batcher's stamps:

    HTTP_RECV_START / _END      the request's head came / its body was read (HTTP)
    GRPC_WAITREAD_START / _END  the handler began, the message read already (gRPC)
    REQUEST_START               decoded: the request goes to its model
    QUEUE_START                 enqueued in the model's batcher
    COMPUTE_START               its batch's run began on an instance's thread
    COMPUTE_INPUT_END           the batch's inputs were gathered
    COMPUTE_OUTPUT_START        the model returned
    COMPUTE_END                 the outputs were split among the batch's requests
    INFER_RESPONSE_COMPLETE     the request's answer was released (after earlier ones, where
                                the model preserves ordering)
    REQUEST_END                 the answer is back at the front end
    HTTP_SEND_START / _END      encoded / written to the client (HTTP)
    GRPC_SEND_START / _END      encoded / the call ended, its answer sent (gRPC)

An ensemble's request has no queue or compute of its own, as in Triton; each of its steps
is a trace of its own whose ``parent_id`` is the ensemble's (a nested ensemble's steps, its
step's).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from batchserve.observability.request_trace import BatchTimes, RequestTrace, batch_times, current
from batchserve.observability.trace_files import Record, Sink
from batchserve.observability.trace_settings import Sample

if TYPE_CHECKING:
    from collections.abc import Awaitable, Iterator

    from batchserve.core.types import InferResponse, Tensor
    from batchserve.observability.request_trace import QueuedWork

Stamp = tuple[str, int]
FORWARDED_ROOT = 0
"""The id forwarded steps give the request they belong to: the worker's trace takes it."""
TRACED, STEPS, STEP_TIMESTAMPS, STEP_TENSORS = 1, 2, 4, 8
"""What a worker asks of the model-owning process with a traced request (``forwarded_levels``):
the batcher's times; its ensemble steps (either mode's trace), with their timestamps and
tensors as its levels say."""


class StepRoot(Protocol):
    """What a step's records are taken for: the trace's levels, its ids, and where its
    steps go as they end."""

    timestamps: bool
    step_tensors: bool
    steps: list[StepTrace]

    def ids(self) -> int: ...


class SteppedTrace(RequestTrace):
    """A traced request whose ensemble steps are traced under it, in either mode: each
    step a ``StepTrace`` numbered by ``ids`` as it starts; with ``--workers`` the steps the
    model-owning process traced come back as Triton's records (``steps_forwarded``)."""

    id: int
    ids: Callable[[], int]

    def __init__(
        self, protocol: str, model: str, tensors: bool, timestamps: bool, step_tensors: bool
    ) -> None:
        super().__init__(protocol, model, tensors)
        self.timestamps = timestamps
        self.step_tensors = step_tensors
        """Whether its steps' tensors are gathered and written (a trace file's level
        TENSORS; spans carry no step's tensors)."""
        self.composite = False
        """Its model is an ensemble: no queue or compute of its own."""
        self.steps: list[StepTrace] = []
        """Its ensemble steps (a nested ensemble's too), as they end."""
        self.forwarded: list[Record] = []
        """Its steps' records, as the model-owning process sent them (``--workers``)."""

    def forwarded_levels(self) -> int:
        """What a worker asks the model-owning process to send back with the answer."""
        timestamps = STEP_TIMESTAMPS if self.timestamps else 0
        return TRACED | STEPS | timestamps | (STEP_TENSORS if self.step_tensors else 0)

    def steps_forwarded(self, records: Iterable[Record]) -> None:
        """The steps the model-owning process ran for it (``ForwardedSteps``), numbered as
        its own: their ids taken here, the request's id for ``FORWARDED_ROOT``. A request
        with steps of its own is an ensemble's (``composite``), as one process marks it."""
        numbered = {FORWARDED_ROOT: self.id}
        for record in records:
            record["id"] = numbered.setdefault(record["id"], self.ids())
            if "parent_id" in record:
                self.composite |= record["parent_id"] == FORWARDED_ROOT
                record["parent_id"] = numbered.setdefault(record["parent_id"], self.ids())
            self.forwarded.append(record)

    def step(self, model: str, version: str) -> StepTrace:
        """A trace of one of its ensemble's steps (or of a nested ensemble's)."""
        return StepTrace(self, self.id, model, version)

    def step_records(self, request_id: str) -> list[Record]:
        """Every step's records, as Triton writes them: those traced here in the order they
        started, then those forwarded."""
        records: list[Record] = []
        for step in sorted(self.steps, key=lambda step: step.id):
            records += step.records(request_id)
        return records + self.forwarded

    def timeline(self) -> list[Stamp]:
        """Its timestamps by Triton's names, from its phases and its batch's times (an
        ensemble's request has no queue or compute of its own)."""
        ends = {phase: end for phase, _, end in self.phases}
        http = self.protocol == "http"
        stamps: list[Stamp] = (
            [("HTTP_RECV_START", self.start)]
            if http
            else [("GRPC_WAITREAD_START", self.start), ("GRPC_WAITREAD_END", self.start)]
        )
        if http and "receive" in ends:
            stamps.append(("HTTP_RECV_END", ends["receive"]))
        if "decode" in ends:
            stamps.append(("REQUEST_START", ends["decode"]))
            if self.batch is not None:
                stamps += _batch_stamps(self.batch, queued=not self.composite)
            done = ends.get("infer") or self.failed_ns
            if done:
                stamps.append(("REQUEST_END", done))
        side = "HTTP" if http else "GRPC"
        if "encode" in ends:
            stamps.append((f"{side}_SEND_START", ends["encode"]))
            if "send" in ends:
                stamps.append((f"{side}_SEND_END", ends["send"]))
        return stamps


class FileTrace(SteppedTrace):
    """A traced request written as Triton's records when it ends."""

    def __init__(
        self,
        protocol: str,
        model: str,
        sample: Sample,
        ids: Callable[[], int],
        sink: Sink,
    ) -> None:
        tensors = "TENSORS" in sample.levels
        super().__init__(protocol, model, tensors, "TIMESTAMPS" in sample.levels, tensors)
        self.sample = sample
        self.ids = ids
        self.id = ids()
        self.sink = sink
        self.sent_at_call_end = protocol == "grpc"

    def finish(self) -> None:
        """Write its records (and its steps'). gRPC: called when the call ends, its answer
        sent (``sent_at_call_end``); a stream's request, when its last response is queued."""
        self.leave()
        if self.sent_at_call_end:
            self.mark("send")
        self.settle_batch()
        response = self.response
        version = response.model_version if response is not None else ""
        request_id = response.id if response is not None and response.id else self.request_id
        records = [_model_record(self.id, self.model, version, request_id, None)]
        if self.timestamps:
            records += _timestamps(self.id, self.timeline())
        if self.tensors:
            records += tensor_records(self.id, "TENSOR_QUEUE_INPUT", self.inputs)
            if response is not None:
                records += tensor_records(self.id, "TENSOR_BACKEND_OUTPUT", response.outputs)
        records += self.step_records(request_id)
        self.sink(self.sample.scope, self.sample.log_frequency, records)


class StepTrace:
    """One ensemble step of a traced request: a trace of its own, with the ensemble's as
    its parent. Current while its step is submitted, so that a nested ensemble's steps
    take it as theirs."""

    def __init__(self, root: StepRoot, parent: int, model: str, version: str) -> None:
        self.root = root
        self.id = root.ids()
        self.parent = parent
        self.model = model
        self.version = version
        self.start = time.monotonic_ns()
        self.composite = False
        self.item: QueuedWork | None = None
        self.stamps: list[Stamp] = []
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []

    @property
    def tensors(self) -> bool:
        """Whether its tensors are written (level TENSORS): only then are they gathered."""
        return self.root.step_tensors

    def step(self, model: str, version: str) -> StepTrace:
        return StepTrace(self.root, self.id, model, version)

    def queued(self, item: QueuedWork) -> None:
        self.item = item

    def done(self, inputs: Iterable[Tensor], outputs: Iterable[Tensor]) -> None:
        """The step answered (its outputs) or failed (none)."""
        end = time.monotonic_ns()
        self.stamps = [("REQUEST_START", self.start)]
        item = self.item
        if item is not None and item.future.done():
            ok = not item.future.cancelled() and item.future.exception() is None
            self.stamps += _batch_stamps(batch_times(item, end, ok), queued=not self.composite)
        self.stamps.append(("REQUEST_END", end))
        if self.tensors:
            self.inputs, self.outputs = list(inputs), list(outputs)
        self.root.steps.append(self)

    def records(self, request_id: str) -> list[Record]:
        """Its records, once the request ends (they carry its request id, as Triton's)."""
        records = [_model_record(self.id, self.model, self.version, request_id, self.parent)]
        if self.root.timestamps:
            records += _timestamps(self.id, self.stamps)
        if self.root.step_tensors:
            records += tensor_records(self.id, "TENSOR_QUEUE_INPUT", self.inputs)
            records += tensor_records(self.id, "TENSOR_BACKEND_OUTPUT", self.outputs)
        return records


class ForwardedSteps:
    """The ensemble steps of a request a worker traces (``--workers``), traced where
    they run, in the model-owning process, and sent back with the answer
    (``steps_forwarded``). Current while the request runs, as a step is while submitted."""

    def __init__(self, levels: int, request_id: str) -> None:
        self.request_id = request_id
        self.timestamps = bool(levels & STEP_TIMESTAMPS)
        self.step_tensors = bool(levels & STEP_TENSORS)
        self.id = FORWARDED_ROOT
        self.composite = False
        self.steps: list[StepTrace] = []
        self._ids = itertools.count(FORWARDED_ROOT + 1)

    def ids(self) -> int:
        return next(self._ids)

    def step(self, model: str, version: str) -> StepTrace:
        return StepTrace(self, self.id, model, version)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Current meanwhile: an ensemble submitted now runs its steps under it."""
        token = enter_step(self)
        try:
            yield
        finally:
            leave_step(token)

    async def around(self, infer: Awaitable[InferResponse]) -> InferResponse:
        """``infer``'s answer, its ensemble's steps traced here meanwhile."""
        with self.entered():
            return await infer

    def records(self) -> list[Record]:
        """The steps' records, in the order they started (those that ended by now)."""
        return [r for step in sorted(self.steps, key=lambda step: step.id)
                for r in step.records(self.request_id)]  # fmt: skip


Traced = StepTrace | ForwardedSteps
_step: ContextVar[Traced | None] = ContextVar("batchserve_trace_step", default=None)


def forwarded_levels(trace: RequestTrace | None) -> int:
    """What a worker asks of the model-owning process for ``trace`` (0: not traced)."""
    if trace is None:
        return 0
    return trace.forwarded_levels() if isinstance(trace, SteppedTrace) else TRACED


def _traced() -> SteppedTrace | Traced | None:
    """The step being submitted, else the request, where its steps are traced."""
    step = _step.get()
    if step is not None:
        return step
    trace = current()
    return trace if isinstance(trace, SteppedTrace) else None


def step_of(model: str, version: str) -> StepTrace | None:
    """The trace of an ensemble step about to run, where the request's steps are traced."""
    traced = _traced()
    return None if traced is None else traced.step(model, version)


def enter_step(step: Traced) -> Token[Traced | None]:
    """``step`` is current while its request is submitted: a nested ensemble's task takes
    it with the context."""
    return _step.set(step)


def leave_step(token: Token[Traced | None]) -> None:
    _step.reset(token)


def mark_composite() -> None:
    """The current traced request (or step) is an ensemble's."""
    traced = _traced()
    if traced is not None:
        traced.composite = True


def _batch_stamps(batch: BatchTimes, queued: bool) -> list[Stamp]:
    enqueued, dispatched, answered, _, run = batch
    if not queued:
        return [("INFER_RESPONSE_COMPLETE", answered)] if answered else []
    stamps: list[Stamp] = [("QUEUE_START", enqueued)]
    if run:
        stamps += zip(("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                       "COMPUTE_END"), run, strict=True)  # fmt: skip
    elif answered:
        stamps += [("COMPUTE_START", dispatched), ("COMPUTE_END", answered)]
    if answered:
        stamps.append(("INFER_RESPONSE_COMPLETE", answered))
    return stamps


def _model_record(
    id_: int, model: str, version: str, request_id: str, parent: int | None
) -> Record:
    record: Record = {"id": id_, "model_name": model,
                      "model_version": int(version) if version.isdecimal() else -1}  # fmt: skip
    if request_id:
        record["request_id"] = request_id
    if parent is not None:
        record["parent_id"] = parent
    return record


def _timestamps(id_: int, stamps: list[Stamp]) -> list[Record]:
    """One record per timestamp, as Triton writes them, in the order they happened."""
    ordered = sorted(stamps, key=lambda stamp: stamp[1])
    return [{"id": id_, "timestamps": [{"name": name, "ns": ns}]} for name, ns in ordered]


def tensor_records(id_: int, activity: str, tensors: Iterable[Tensor]) -> list[Record]:
    return [
        {
            "id": id_,
            "activity": activity,
            "tensor": {
                "name": t.name,
                "data": tensor_data(t.data, t.datatype.wire),
                "shape": ",".join(str(d) for d in t.shape),
                "dtype": t.datatype.wire,
            },
        }
        for t in tensors
    ]


def tensor_data(data: Any, dtype: str) -> str:
    """Triton's ``data``: the elements as comma-separated values, row-major; BYTES quoted
    (a quote inside doubled, so that a CSV reader, as ``trace_summary.py``'s, reads them
    back); BF16, which Triton leaves empty, empty."""
    if dtype == "BF16":
        return ""
    array = np.asarray(data)
    if dtype == "BYTES":
        return ",".join(
            '"' + _text(element).replace('"', '""') + '"' for element in array.reshape(-1)
        )
    if dtype == "BOOL":
        array = array.astype(np.uint8)
    return ",".join(array.reshape(-1).astype(str))


def _text(element: object) -> str:
    if isinstance(element, bytes | bytearray | memoryview):
        return bytes(element).decode("utf-8", "replace")
    return str(element)
