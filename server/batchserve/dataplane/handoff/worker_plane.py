"""A worker's stand-in for ``DataPlane`` on the inference path: requests are decoded and
validated here, against a copy of the model's configuration (fetched again after every
repository change), and run by the model-owning process; everything else a worker is asked
goes there whole (``runtime``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import (
    BatchserveError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from batchserve.core.request_memory import UNBOUNDED, RequestMemory
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, InferResponse, Tensor
from batchserve.core.validation import RequestSchema, SchemaLookup, ValidRequest, validate_request
from batchserve.dataplane.busy_poll import BusyPoll
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.errors import error_frame, error_from
from batchserve.dataplane.handoff.frames import STREAM_CREDIT, Frame, FrameProtocol, dispatch
from batchserve.dataplane.handoff.groups import GroupKey, Member, OpenGroups, Share, split
from batchserve.dataplane.handoff.read_mark import ReadMark
from batchserve.dataplane.raw_input import raw_request
from batchserve.dataplane.shared_memory import tensors as shm
from batchserve.dataplane.shared_memory.parameters import REGION
from batchserve.models.decoupled import builtin_backend
from batchserve.models.ensemble_config import answers_many
from batchserve.observability import log_settings
from batchserve.observability.request_trace import RequestTrace, current
from batchserve.observability.trace_files import Record
from batchserve.observability.trace_records import SteppedTrace, forwarded_levels
from batchserve.observability.tracing import RequestTracer
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batch_io import BatchIO
from batchserve.scheduler.padding import row_positions
from batchserve.scheduler.policy import AxesOf, BatchPolicy
from batchserve.scheduler.work import Arrays

logger = logging.getLogger(__name__)

GONE = "the model-owning process is gone"
RELEASE_DELAY_S = 0.02
"""How long freed response blocks wait for a request frame to carry them back before they
go on their own (a write that may wake the model-owning process for nothing else)."""


@dataclass(slots=True)
class _Model:
    """A model version as the worker knows it. After any repository change it is asked for
    again: requests already being read go on with this copy (the generation tells the
    model-owning process whether their validation still holds), new ones wait for the new
    copy, so that a request sent after a reload's answer is judged by the new config."""

    config: ModelConfig
    schema: RequestSchema
    generation: int
    cap: int
    """Samples a work item may hold there (the batch cap derived from the memory budget)."""
    steps: int = 0
    """The positions (rows times a row's: a sequence model's steps, an image model's
    pixels) a work item may hold there; 0: counted in rows."""
    positions: AxesOf = ()
    groups: bool = field(init=False)
    """Whether requests to it can travel together: batched, fixed-size inputs only, and not
    to a model with ragged batching, whose batch inputs count requests (``batch_io.py``), to
    an ensemble whose steps each hold so many requests at once (a group would be one), or to
    a model with preferred batch sizes below its cap: a batch takes whole requests, and a
    group straddling a preferred size would keep the batcher from sending it (Triton's
    ``L0_batcher`` counts the batches its requests make)."""

    def __post_init__(self) -> None:
        preferred = self.config.dynamic_batching.preferred_batch_size
        self.groups = (
            self.cap > 0
            and all(rule.datatype.itemsize for rule in self.schema.inputs)
            and BatchIO.from_config(self.config) is None
            and not self.config.ensemble_scheduling.max_inflight_requests
            and all(size >= self.config.max_batch_size for size in preferred)
        )

    def group_cap(self, inputs: Arrays) -> int:
        """Rows a group of requests shaped as ``inputs`` may hold: the batch cap, and no more
        rows of their positions than the model's hold (a group is one work item there,
        batched as one request)."""
        if not self.steps:
            return self.cap
        return min(self.cap, self.steps // max(1, row_positions(self.positions, inputs)))


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Frame]
    block: int  # request arena block to free on the answer, or INLINE


@dataclass(slots=True)
class _Streamed:
    frames: asyncio.Queue[Frame]
    block: int  # request arena block to free on the last frame, or INLINE


class WorkerPlane:
    """Decode, validate, hand off; the model-owning process's answers come back by frame."""

    def __init__(
        self,
        settings: Settings,
        requests: Arena,
        responses: Arena,
        counts: Callable[[int], Frame] | None = None,
        request_memory: RequestMemory | None = None,
    ) -> None:
        """``counts``: this worker's counts frame, answering the question numbered by its
        argument (the model-owning process asks before a scrape of its metrics).
        ``request_memory``: this worker's share of the bound on requests in flight (none:
        unbounded)."""
        self.settings = settings
        self.request_memory = request_memory or RequestMemory(UNBOUNDED)
        self._counts = counts
        self.requests = requests
        self.responses = responses
        self.busy_poll = BusyPoll(settings.busy_poll_us * 1000)
        self.tracing = RequestTracer.configured(settings.trace_config, sink=self._trace_written)
        self.tracing.settings.on_taken(lambda scope: self.protocol.send(("t", scope)))
        self._loop = asyncio.get_running_loop()
        self.lost = self._loop.create_future()
        self.draining = asyncio.Event()
        self._models: dict[tuple[str, str], _Model] = {}
        self._asked: set[tuple[str, str]] = set()
        self._stale: set[tuple[str, str]] = set()
        """Models whose copy predates the last repository change, until the new one comes."""
        self._learning: dict[tuple[str, str], deque[asyncio.Future[None]]] = {}
        """Requests waiting for a model's configuration, in the order they came."""
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, _Streamed] = {}
        """Requests to decoupled models: their responses come one frame each."""
        self._ids = itertools.count()
        self._leases: dict[int, int] = {}  # response block -> arrays still using it
        self._released: list[int] = []
        self._releasing = False
        self._sent = 0
        """Request frames sent; the model-owning process counts those it read in
        ``_read_mark``, and groups are held while the two differ."""
        self._read_mark = ReadMark(requests)
        self._groups = OpenGroups(self._send_group, self._loop, self._held)
        self._group_members: dict[int, list[Member]] = {}  # sent groups not yet answered
        self._handlers: dict[str, Callable[[Frame], None]] = {
            "o": self._answered,
            "e": self._answered,
            "u": self._answered,
            "m": self._model,
            "v": self._repository_changed,
            "d": lambda frame: self.draining.set(),
            "l": self._log_settings,
            "t": lambda frame: self.tracing.settings.restore(frame[1]),
            "n": self._counts_asked,
            "k": lambda frame: self._groups.release(),
            "p": self._streamed,
            "z": self._streamed,
            "y": lambda frame: self.protocol.send(("y",)),  # this loop runs (``worker_pool``)
        }
        self.protocol = FrameProtocol(
            dispatch(self._handlers, "model-owning process"), self._lost, self._groups.release
        )

    # the model-owning process's frames ----------------------------------------------
    def _lost(self) -> None:
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(Unavailable(GONE))
        for streamed in self._streams.values():
            streamed.frames.put_nowait(("e", 0, *error_frame(Unavailable(GONE))))
        self._streams.clear()
        self._groups.close_all()  # held groups fail in _send_group
        self._asked.clear()
        for key in list(self._learning):
            self._next_turn(key)
        if not self.lost.done():
            self.lost.set_result(None)

    def _answered(self, frame: Frame) -> None:
        if frame[1] in self._streams:
            self._streamed(frame)
            return
        pending = self._pending.pop(frame[1], None)
        if pending is None:
            return
        if pending.block != descriptors.INLINE:
            self.requests.ring.free(pending.block)
        if not pending.future.done():
            pending.future.set_result(frame)
        elif frame[0] == "o" and frame[4] != descriptors.INLINE:
            self._release(frame[4])  # answered after the client left

    def _streamed(self, frame: Frame) -> None:
        """A decoupled model's response ("p"), or the end of them ("z", "e")."""
        streamed = self._streams.get(frame[1])
        if streamed is None:  # the client left
            if frame[0] == "p" and frame[4] != descriptors.INLINE:
                self._release(frame[4])
            return
        if frame[0] != "p":
            del self._streams[frame[1]]
            if streamed.block != descriptors.INLINE:
                self.requests.ring.free(streamed.block)
        streamed.frames.put_nowait(frame)

    def _held(self) -> bool:
        """Whether open groups wait for the model-owning process to read this worker's last
        request frame. It says so by a "k" frame, sent only while the groups wait; they are
        looked at again whenever a frame from it arrives (``read_mark``)."""
        return self.protocol.connected and self._read_mark.hold(self._sent)

    def _model(self, frame: Frame) -> None:
        _, model, version, config_bytes, generation, cap, steps = frame
        key = (model, version)
        self._asked.discard(key)
        self._stale.discard(key)
        if config_bytes is None:
            self._models.pop(key, None)
        else:
            config = ModelConfig.FromString(config_bytes)
            schema = RequestSchema.of(config)
            axes = BatchPolicy.from_config(config, 1).position_inputs
            self._models[key] = _Model(config, schema, generation, cap, steps, axes)
        self._next_turn(key)

    def _repository_changed(self, frame: Frame) -> None:
        for key in self._models:
            self._stale.add(key)
            self._ask(key)

    def _counts_asked(self, frame: Frame) -> None:
        if self._counts is not None:
            self.protocol.send(self._counts(frame[1]))

    def _log_settings(self, frame: Frame) -> None:
        """The model-owning process's log settings, as a client last set them."""
        log_settings.update({k: v for k, v in frame[1].items() if k != "log_file"})

    def _ask(self, key: tuple[str, str]) -> None:
        if key not in self._asked:
            self._asked.add(key)
            self.protocol.send(("q", *key))

    def _next_turn(self, key: tuple[str, str]) -> None:
        waiting = self._learning.get(key)
        if waiting and not waiting[0].done():
            waiting[0].set_result(None)

    # what the adapters call ----------------------------------------------------------
    def knows(self, model: str, version: str) -> bool:
        """Whether this worker can decode requests to the model itself; when not, it asks
        (the request at hand goes to the model-owning process whole)."""
        key = (model, version)
        if key in self._learning:  # others wait for it: after them
            return False
        if key not in self._models or key in self._stale:
            self._ask(key)
            return False
        return True

    async def learn(self, model: str, version: str) -> bool:
        """After ``knows`` said no: wait for the model-owning process's answer, behind the
        requests that came first; True when the model is served (its requests are decoded
        here), False when not (they go there whole, for its exact error). One at a time in
        arrival order, each sends its request before the next goes on, so the steps of a
        sequence cannot overtake each other while a worker learns their model."""
        key = (model, version)
        waiting = self._learning.setdefault(key, deque())
        turn: asyncio.Future[None] = self._loop.create_future()
        waiting.append(turn)
        if len(waiting) == 1 and key not in self._asked:  # the answer is already here
            turn.set_result(None)
        try:
            await turn
        finally:
            waiting.remove(turn)
            if waiting:
                self._next_turn(key)
            else:
                del self._learning[key]
        return key in self._models

    def schema_lookup(self, model: str, version: str) -> SchemaLookup:
        return partial(self._schema, model, version)

    def _schema(self, model: str, version: str) -> RequestSchema:
        known = self._models.get((model, version))
        if known is None:  # forgotten since knows(): the model went away meanwhile
            raise Unavailable(f"model '{model}' changed while the request was read; retry")
        return known.schema

    def raw_request(self, body: bytes, model: str, version: str) -> InferRequest:
        known = self._models.get((model, version))
        if known is None:
            raise Unavailable(f"model '{model}' changed while the request was read; retry")
        return raw_request(body, known.config, model, version)

    def decode(
        self,
        decode: Callable[[], InferRequest],
        model: str,
        version: str,
        protocol: str,
        peer: str | None = None,
    ) -> InferRequest:
        """Run a wire decoder; a malformed request is counted by the model-owning process.
        Inputs in the client's shared memory are read there (``peer`` goes with them)."""
        try:
            request = decode()
        except (InvalidArgument, NotFound) as exc:
            self._malformed(model, version, protocol, exc)
            raise
        request.peer = peer
        return request

    def _malformed(self, model: str, version: str, protocol: str, error: BatchserveError) -> None:
        self.protocol.send(("x", model, version, protocol, *error_frame(error)))

    def _trace_written(self, scope: str, log_frequency: int, records: list[Record]) -> None:
        """A trace-file trace: the model-owning process writes the file."""
        self.protocol.send(("w", scope, log_frequency, records))

    async def infer(self, request: InferRequest) -> InferResponse:
        self.busy_poll.touch()
        model, version = request.model_name, request.model_version
        known = self._models.get((model, version))
        verdict = None
        in_shared_memory = shm.uses_shared_memory(request)
        sequence = None if request.sequence is None else request.sequence.as_tuple()
        trace = current() if self.tracing.on else None
        if known is not None and not in_shared_memory and sequence is None:
            try:
                valid = validate_request(request.inputs, request.outputs, known.schema,
                                         request.layout, request.verdict)  # fmt: skip
            except InvalidArgument as exc:
                self._malformed(model, version, request.protocol, exc)
                raise
            if not any(o.classification or REGION in o.parameters for o in request.outputs or ()):
                cap = known.group_cap(valid.inputs) if known.groups else 0
                if valid.batch_size <= cap and trace is None:
                    return await self._grouped(request, known, valid, cap)
                verdict = (known.generation, valid.batch_size, list(valid.output_names))
        block, inline, inputs, outputs = self._placed(request)
        rid = next(self._ids)
        future = self._loop.create_future()
        self._pending[rid] = _Pending(future, block)
        peer = request.peer if in_shared_memory else None
        self._send_request(("i", rid, model, version, request.id, request.protocol,
                            request.priority, request.timeout_us, peer, block, inline, inputs,
                            outputs, verdict, sequence, forwarded_levels(trace)))  # fmt: skip
        try:
            frame = await future
        except asyncio.CancelledError:
            if rid in self._pending:
                self.protocol.send(("c", rid))  # its block is freed when the answer comes
            raise
        self.busy_poll.touch()
        if trace is not None:
            _traced_answer(trace, frame)
        if frame[0] == "e":
            raise error_from(frame[2], frame[3])
        return self._response(request, frame)

    def _placed(self, request: InferRequest) -> tuple[int, bytes, list[Any], list[Any] | None]:
        """The request's inputs in the request arena (those in the client's shared memory
        described only), and its requested outputs, as the hand-off frames carry them."""
        placed = [
            (t.name, t.datatype, t.data) for t in request.inputs if REGION not in t.parameters
        ]
        block, inline, described = descriptors.place(placed, self.requests)
        inputs = [(*d, None) for d in described] + [
            (t.name, t.datatype.wire, tuple(t.shape), 0, 0, t.parameters)
            for t in request.inputs
            if REGION in t.parameters
        ]
        outputs = (
            None
            if request.outputs is None
            else [(o.name, o.binary, o.classification, o.parameters) for o in request.outputs]
        )
        return block, inline, inputs, outputs

    async def respond(
        self, request: InferRequest, streaming: bool = True
    ) -> AsyncGenerator[InferResponse, None]:
        """``DataPlane.respond``: a built-in backend's model's responses come one frame each
        (one that is not decoupled sends one there, as a stream of it gets)."""
        known = self._models.get((request.model_name, request.model_version))
        if known is None or not (builtin_backend(known.config) or answers_many(known.config)):
            yield await self.infer(request)
            return
        self.busy_poll.touch()
        block, inline, inputs, outputs = self._placed(request)
        rid = next(self._ids)
        streamed = self._streams[rid] = _Streamed(asyncio.Queue(), block)
        peer = request.peer if shm.uses_shared_memory(request) else None
        sequence = None if request.sequence is None else request.sequence.as_tuple()
        trace = current() if self.tracing.on else None
        self._send_request(("s", rid, request.model_name, request.model_version, request.id,
                            request.protocol, request.priority, request.timeout_us, peer, block,
                            inline, inputs, outputs, streaming, request.empty_final,
                            sequence, forwarded_levels(trace)))  # fmt: skip
        taken = 0
        try:
            while (frame := await streamed.frames.get())[0] == "p":
                response = self._response(request, frame)
                response.final = frame[9]
                yield response  # back here once the client's stream has room for more
                taken += 1
                if taken == STREAM_CREDIT // 2:
                    self.protocol.send(("a", rid, taken))
                    taken = 0
        finally:
            if rid in self._streams:  # the client left first: stop the work there
                self.protocol.send(("c", rid))
        if trace is not None:
            _traced_answer(trace, frame)
        if frame[0] == "e":
            raise error_from(frame[2], frame[3])

    async def _grouped(
        self, request: InferRequest, known: _Model, valid: ValidRequest, cap: int
    ) -> InferResponse:
        """Travel with the other requests of this pass and the next that can
        (``groups.py``)."""
        layout = tuple(sorted((t.name, t.datatype.wire, t.shape[1:]) for t in request.inputs))
        key = GroupKey(request.model_name, request.model_version, known.generation,
                       request.protocol, request.priority, request.timeout_us,
                       valid.output_names, layout)  # fmt: skip
        future: asyncio.Future[Share] = self._loop.create_future()
        member = Member(valid.inputs, valid.batch_size, future)
        self._groups.add(key, member, cap)
        try:
            share = await future
        except asyncio.CancelledError:
            self._left(member)
            raise
        self.busy_poll.touch()
        frame = share.frame
        if frame[0] == "e":
            raise error_from(frame[2], frame[3])
        outputs = [
            Tensor(name, BY_WIRE[wire], (share.count, *shape[1:]), share.output(name))
            for name, wire, shape, _, _ in frame[6]
        ]
        by_name = {t.name: t for t in outputs}
        response = InferResponse(frame[2], frame[3], request.id, [by_name[n] for n in frame[8]])
        if known.schema.response_parameters:
            response.parameters = dict(known.schema.response_parameters)
        return response

    def _left(self, member: Member) -> None:
        """A client left: once every client of its group has, the group is cancelled there
        (its place in the queue freed), as a lone request's is."""
        members = self._group_members.get(member.group)
        if members is not None and all(m.future.cancelled() for m in members):
            self.protocol.send(("c", member.group))

    def _send_group(self, key: GroupKey, members: list[Member]) -> None:
        members = [member for member in members if not member.future.done()]
        if not members:
            return  # every client left before it went
        if not self.protocol.connected:
            for member in members:
                member.future.set_exception(Unavailable("the model-owning process is gone"))
            return
        model, version, generation, protocol, priority, timeout_us, names, layout = key
        total = sum(member.batch_size for member in members)
        inputs = [(name, BY_WIRE[wire], (total, *rest)) for name, wire, rest in layout]
        block, inline, described = descriptors.place_rows(
            inputs, [member.arrays for member in members], self.requests
        )
        gid = next(self._ids)
        for member in members:
            member.group = gid
        self._group_members[gid] = members
        future: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[gid] = _Pending(future, block)
        future.add_done_callback(partial(self._answer_group, gid, key, members))
        self._send_request(("g", gid, model, version, protocol, priority, timeout_us, block,
                            inline, described, (generation, total, list(names)),
                            len(members)))  # fmt: skip

    def _answer_group(
        self, gid: int, key: GroupKey, members: list[Member], future: asyncio.Future[Frame]
    ) -> None:
        del self._group_members[gid]
        error = future.exception()
        if error is not None:
            for member in members:
                if not member.future.done():
                    member.future.set_exception(error)
            return
        frame = future.result()
        if frame[0] == "u":  # the group failed alone: maybe through one member's inputs
            for member in members:
                self._send_group(key, [member])  # each on its own: only its own fault fails it
            return
        outputs = self._outputs(frame) if frame[0] == "o" else {}
        split(frame, outputs, members)

    def _outputs(self, frame: Frame) -> dict[str, np.ndarray]:
        """The arrays of an answer: views of the response arena, whose block goes back when
        the last view of it does (read at once when inline or of variable size)."""
        block, inline, described = frame[4], frame[5], frame[6]
        arrays: dict[str, np.ndarray] = {}
        leased = 0
        for descriptor in described:
            name, wire, shape, start, _ = descriptor
            datatype = BY_WIRE[wire]
            if block == descriptors.INLINE or datatype.itemsize == 0:
                arrays[name] = descriptors.read(self.responses, block, inline, descriptor)
            else:
                arrays[name] = self.responses.leased(block + start, datatype, tuple(shape),
                                                     partial(self._lease_ended, block))  # fmt: skip
                leased += 1
        if block != descriptors.INLINE:
            if leased:
                self._leases[block] = self._leases.get(block, 0) + leased
            else:
                self._release(block)
        return arrays

    def _response(self, request: InferRequest, frame: Frame) -> InferResponse:
        _, _, model_name, model_version, _, _, described, in_memory, order = frame[:9]
        arrays = self._outputs(frame)
        tensors = {
            name: Tensor(name, BY_WIRE[wire], tuple(shape), arrays[name])
            for name, wire, shape, _, _ in described
        }
        for name, wire, shape, parameters in in_memory:
            datatype = BY_WIRE[wire]
            placeholder = np.empty(0, dtype=datatype.numpy)
            tensors[name] = Tensor(name, datatype, tuple(shape), placeholder, dict(parameters),
                                   in_shared_memory=True)  # fmt: skip
        response = InferResponse(model_name, model_version, request.id, [tensors[n] for n in order])
        known = self._models.get((request.model_name, request.model_version))
        if known is not None and known.schema.response_parameters:
            response.parameters = dict(known.schema.response_parameters)
        return response

    # response blocks -----------------------------------------------------------------
    def _lease_ended(self, block: int, offset: int) -> None:
        left = self._leases[block] - 1
        if left:
            self._leases[block] = left
        else:
            del self._leases[block]
            self._release(block)

    def _release(self, block: int) -> None:
        """Return a response block to the model-owning process, with others freed soon."""
        self._released.append(block)
        if not self._releasing:
            self._releasing = True
            self._loop.call_later(RELEASE_DELAY_S, self._send_released)

    def _send_released(self) -> None:
        self._releasing = False
        self._return_released()

    def _return_released(self) -> None:
        if self._released:
            self.protocol.send(("r", self._released))
            self._released = []

    def _send_request(self, frame: Frame) -> None:
        """A request frame ("i", "s", "g"): counted (``read_mark``), and sent with the
        response blocks freed since the last one, in the same write."""
        self._sent += 1
        self._return_released()
        self.protocol.send(frame)


def _traced_answer(trace: RequestTrace, frame: Frame) -> None:
    """What the model-owning process sent back for a traced request: its batch's times (its
    queue and compute spans), and an ensemble's steps, traced where they ran (with an error,
    those it ran before it failed)."""
    if frame[0] == "e":
        steps = frame[4] if len(frame) > 4 else ()
    elif frame[0] == "z":  # a stream's end: a decoupled ensemble's steps
        steps = frame[2]
    else:
        if frame[9] is not None:
            trace.ran(*frame[9])
        steps = frame[10]
    if steps and isinstance(trace, SteppedTrace):
        trace.steps_forwarded(steps)
