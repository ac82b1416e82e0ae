"""The model-owning process's end of one worker's socket: runs the requests the worker
decoded through the same ``DataPlane.infer`` as a single-process server, and answers
the worker's other questions (a model's configuration, counts to record)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import (
    BatchserveError,
    InvalidArgument,
    Overloaded,
    Unsupported,
    decoupled_refusal,
)
from batchserve.core.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    SequenceFlags,
    Tensor,
)
from batchserve.core.validation import ValidRequest, validate_request
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.errors import error_frame, error_from
from batchserve.dataplane.handoff.frames import STREAM_CREDIT, Frame, FrameProtocol, dispatch
from batchserve.dataplane.handoff.read_mark import ReadMark
from batchserve.dataplane.plane import DataPlane
from batchserve.dataplane.shared_memory.parameters import placeholder
from batchserve.models.model_table import ServedVersion
from batchserve.observability import trace_records
from batchserve.observability.request_trace import batch_times
from batchserve.scheduler.execution import pinned_on_requests
from batchserve.scheduler.work import Arrays, WorkItem

logger = logging.getLogger(__name__)

Counts = Callable[[int, Frame], None]
InputFrame = tuple[str, str, tuple[int, ...], int, int, dict[str, object] | None]


class EngineLink:
    """One worker, seen from the process that owns the models."""

    def __init__(
        self, index: int, plane: DataPlane, requests: Arena, responses: Arena, counts: Counts
    ) -> None:
        self.index = index
        self.plane = plane
        self.requests = requests  # the worker allocates here; read in place
        self.responses = responses  # allocated here; the worker says when to free
        self._counts = counts
        self.handed_over = 0
        """Inference requests the worker handed over, for its share on the metrics port."""
        self.handoffs = 0
        """Frames that carried them: a group of requests is one."""
        self._unacknowledged = 0
        """Request frames read since the last count in ``_read_mark`` (``_acknowledge``)."""
        self._read_mark = ReadMark(requests)
        self._pending: dict[int, asyncio.Future[Any]] = {}  # a task, or a queued item's
        self._credit: dict[int, asyncio.Semaphore] = {}
        """Responses each decoupled request may still send before its worker's client
        takes some (``frames.STREAM_CREDIT``)."""
        self._counts_asked: dict[int, asyncio.Future[None]] = {}
        """Scrapes waiting for the worker's counts, by the number of their question."""
        self._questions = itertools.count()
        self.heard = time.monotonic()
        """When the worker's event loop last answered a check ("y"), or said it listens."""
        loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        self.listening = loop.create_future()
        self._handlers: dict[str, Callable[[Frame], None]] = {
            "i": self._answering(self._infer),
            "s": self._stream,
            "g": self._answering(self._group),
            "c": self._cancel,
            "r": self._release,
            "x": self._malformed,
            "q": self._query,
            "n": self._counted,
            "h": self._listening,
            "y": self._answered_check,
            "a": self._credited,
            "t": lambda frame: self.plane.control.trace.taken(frame[1]),
            "w": self._trace_written,
        }
        self.protocol = FrameProtocol(
            dispatch(self._handlers, f"worker {index}"), self._lost, self._acknowledge
        )

    def _trace_written(self, frame: Frame) -> None:
        """A trace the worker traced to the trace file, which this process writes."""
        files = self.plane.tracing.files
        if files is not None:
            files.collect_renumbered(frame[1], frame[2], frame[3])

    def _lost(self) -> None:
        """The worker is gone: nobody waits for its requests any more."""
        for waiting in self._pending.values():
            waiting.cancel()
        self._pending.clear()
        for asked in self._counts_asked.values():
            if not asked.done():
                asked.set_result(None)  # its last counts are all there will be
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.listening.done():
            self.listening.set_exception(ConnectionError("the worker exited while starting"))

    def send(self, frame: Frame) -> None:
        if self.protocol.connected:
            self.protocol.send(frame)

    def send_now(self, frame: Frame) -> None:
        if self.protocol.connected:
            self.protocol.send_now(frame)

    def _acknowledge(self) -> None:
        """Count the worker's request frames this process has read, once per read: while
        some are unread the worker holds its next requests, which then travel together
        (``groups.py``), so that this process's cost per request falls as its load rises.
        A worker that holds some is told ("k"); one that holds none is left asleep
        (``read_mark``). A read also keeps this loop polling (``--busy-poll-us``), as a
        request does the worker's."""
        self.plane.busy_poll.touch()
        if self._unacknowledged:
            owed = self._read_mark.advance(self._unacknowledged)
            self._unacknowledged = 0
            if owed:
                self.send(("k",))

    # requests ------------------------------------------------------------------------
    def _answering(self, handle: Callable[[Frame], None]) -> Callable[[Frame], None]:
        """``handle``, with an error that is not batchserve's answered to the worker as an
        internal error: logged and dropped, it left the client waiting for ever (a version
        ``int`` refused did, before versions were checked as digits 0-9)."""

        def answered(frame: Frame) -> None:
            try:
                handle(frame)
            except Exception as exc:
                logger.exception("request frame failed", extra={"tag": str(frame[0])})
                self._pending.pop(frame[1], None)
                self._answer_error(frame[1], exc)

        return answered

    def _infer(self, frame: Frame) -> None:
        self._unacknowledged += 1  # first: a frame not understood is still read (read_mark)
        (_, rid, model, version, request_id, protocol, priority, timeout_us, peer, block,
         inline, inputs, outputs, verdict, sequence, _) = frame  # fmt: skip
        self.handed_over += 1
        self.handoffs += 1
        if verdict is not None:  # validated by the worker; plain inputs and outputs
            served = self.plane.served_or_none(model, version)
            if (
                served is not None
                and served.responder is None  # a built-in backend's: ``plane.infer`` answers
                and served.schema.generation == verdict[0]
            ):
                self._admit(rid, served, frame)
                return
        try:
            request = self._request(model, version, request_id, protocol, priority, timeout_us,
                                    block, inline, inputs, outputs)  # fmt: skip
            if sequence is not None:
                request.sequence = SequenceFlags(*sequence)
            if any(tensor.parameters for tensor in request.inputs) or any(
                output.parameters for output in request.outputs or ()
            ):
                request = self.plane.decode(lambda: request, model, version, protocol, peer)
        except BatchserveError as exc:
            self._answer_error(rid, exc)
            return
        infer = self.plane.infer(request)
        steps = None
        if frame[-1] & trace_records.STEPS:  # traced: its ensemble steps are too
            steps = trace_records.ForwardedSteps(frame[-1], request.id)
            infer = steps.around(infer)
        task = asyncio.get_running_loop().create_task(infer)
        self._pending[rid] = task
        task.add_done_callback(partial(self._answer, rid, steps))

    def _admit(self, rid: int, served: ServedVersion, frame: Frame) -> None:
        """The common case without a coroutine: what ``DataPlane.infer`` does, for a request
        the worker validated against this very schema, with plain outputs."""
        (_, _, _, _, request_id, protocol, priority, timeout_us, _, block, inline, inputs, _,
         (_, batch_size, names), _, traced) = frame  # fmt: skip
        read, requests = descriptors.read, self.requests
        arrays = {d[0]: read(requests, block, inline, d[:5]) for d in inputs}
        valid = ValidRequest(arrays, batch_size, tuple(names))
        if traced & trace_records.STEPS:  # traced: an ensemble's steps are too
            steps = trace_records.ForwardedSteps(traced, request_id)
            with steps.entered():  # (an ensemble's run takes it with its context)
                self._submit(rid, served, valid, priority, timeout_us, protocol, request_id,
                             1, True, steps)  # fmt: skip
            return
        self._submit(rid, served, valid, priority, timeout_us, protocol, request_id, 1,
                     bool(traced))  # fmt: skip

    def _group(self, frame: Frame) -> None:
        """Requests one worker decoded in two passes of its loop, for the same model version,
        layout and options, sent as one: one work item, each request counted in the
        statistics (``groups.py``)."""
        self._unacknowledged += 1
        (_, gid, model, version, protocol, priority, timeout_us, block, inline, inputs,
         (generation, total, names), members) = frame  # fmt: skip
        self.handed_over += members
        self.handoffs += 1
        try:
            served = self.plane.served(model, version)
            read, requests = descriptors.read, self.requests
            arrays = {d[0]: read(requests, block, inline, d) for d in inputs}
            if served.schema.generation != generation:  # reloaded since the worker looked
                tensors = [Tensor(d[0], BY_WIRE[d[1]], arrays[d[0]].shape, arrays[d[0]])
                           for d in inputs]  # fmt: skip
                wanted = [RequestedOutput(name) for name in names]
                valid = validate_request(tensors, wanted, served.schema)
            else:
                valid = ValidRequest(arrays, total, tuple(names))
        except BatchserveError as exc:
            self._answer_error(gid, exc)
            return
        self._submit(gid, served, valid, priority, timeout_us, protocol, "", members)

    def _submit(
        self, rid: int, served: ServedVersion, valid: ValidRequest, priority: int,
        timeout_us: int, protocol: str, request_id: str, members: int, timed: bool = False,
        steps: trace_records.ForwardedSteps | None = None,
    ) -> None:  # fmt: skip
        """``timed``: the worker traces the request; its answer carries the batcher's times,
        and ``steps``' records (its ensemble's steps)."""
        started = time.monotonic_ns()
        served.stats.received += members
        try:
            if served.responder is not None:  # reloaded as decoupled since the worker looked
                raise decoupled_refusal(protocol)
            item = DataPlane.work_item(served, valid, priority, timeout_us, started)
            item.clients = members
            served.batcher.submit(item)
        except BatchserveError as exc:
            full = isinstance(exc, Overloaded)  # (only ``submit`` refuses so: ``item`` is made)
            if full and members > 1 and not served.batcher.queue.full_for(item.priority):
                # the queue holds fewer than the group: so that as many are queued as it has
                # room for and only the rest refused
                self._members_again(rid, served, members)
                return
            DataPlane.record_failure(served, started, exc, protocol, request_id, members)
            self._answer_error(rid, exc)
            return
        self._pending[rid] = item.future
        finish = partial(self._finish, rid, served, item, started, protocol, request_id,
                         members, timed, steps)  # fmt: skip
        item.future.add_done_callback(finish)

    def _members_again(self, rid: int, served: ServedVersion, members: int) -> None:
        """The worker sends a group's members again one by one, each to be counted and
        answered on its own."""
        served.stats.received -= members
        self.send(("u", rid))

    def _finish(
        self, rid: int, served: ServedVersion, item: WorkItem, started: int, protocol: str,
        request_id: str, members: int, timed: bool, steps: trace_records.ForwardedSteps | None,
        future: asyncio.Future[Arrays],
    ) -> None:  # fmt: skip
        if self._pending.pop(rid, None) is None:
            return  # the worker went away
        error = asyncio.CancelledError() if future.cancelled() else future.exception()
        if error is not None:
            if members > 1 and (pinned_on_requests(error) or isinstance(error, Overloaded)):
                # a group failed alone, so one of its clients' requests may be poisoned; or a
                # queue (an ensemble step's) had room for fewer than the group
                self._members_again(rid, served, members)
                return
            DataPlane.record_failure(served, started, error, protocol, request_id, members)
            self._answer_error(rid, error, steps)
            return
        arrays = future.result()
        self.plane.busy_poll.touch()
        DataPlane.record_success(served, started, item, protocol, members)
        types = served.output_types
        names = item.output_names
        try:
            block, inline, described = descriptors.place(
                [(n, types[n], arrays[n]) for n in names], self.responses
            )
        except BatchserveError as exc:
            self._answer_error(rid, exc)
            return
        timing = batch_times(item, time.monotonic_ns(), True) if timed else None
        records = steps.records() if steps is not None else ()
        self.send(("o", rid, served.name, str(served.version), block, inline, described, (),
                   names, timing, records))  # fmt: skip

    def _request(
        self, model: str, version: str, request_id: str, protocol: str, priority: int,
        timeout_us: int, block: int, inline: bytes, inputs: list[InputFrame],
        outputs: list[tuple[str, bool | None, int, dict[str, object]]] | None,
    ) -> InferRequest:  # fmt: skip
        tensors = []
        for name, wire, shape, start, size, parameters in inputs:
            datatype = BY_WIRE[wire]
            if parameters:  # in the client's shared memory: DataPlane.decode reads it
                data = placeholder(parameters, False, datatype, shape, name)
                assert data is not None
            else:
                data = descriptors.read(
                    self.requests, block, inline, (name, wire, shape, start, size)
                )
            tensors.append(Tensor(name, datatype, shape, data, dict(parameters or {})))
        requested = (
            None
            if outputs is None
            else [RequestedOutput(n, b, k, dict(p)) for n, b, k, p in outputs]
        )
        return InferRequest(
            model_name=model, model_version=version, id=request_id, inputs=tensors,
            outputs=requested, priority=priority, timeout_us=timeout_us, protocol=protocol,
        )  # fmt: skip

    def _cancel(self, frame: Frame) -> None:
        waiting = self._pending.get(frame[1])
        if waiting is not None:
            waiting.cancel()

    def _answer(
        self,
        rid: int,
        steps: trace_records.ForwardedSteps | None,
        task: asyncio.Task[InferResponse],
    ) -> None:
        """``steps``: those of a request the worker traces, sent with its answer."""
        if self._pending.pop(rid, None) is None:
            return  # the worker went away
        if task.cancelled():
            self.send(("e", rid, "Cancelled", "request cancelled"))
            return
        error = task.exception()
        if error is not None:
            self._answer_error(rid, error, steps)
            return
        try:
            response = task.result()
            records = steps.records() if steps is not None else ()
            self.send(("o", rid, *self._placed(response), None, records))
        except BatchserveError as exc:
            self._answer_error(rid, exc)

    def _placed(self, response: InferResponse) -> tuple[Any, ...]:
        """A response's outputs placed in the response arena, as an answer frame carries
        them: model, version, block, inline bytes, descriptors, outputs in the client's
        shared memory, and the order of all."""
        placed = [(t.name, t.datatype, t.data) for t in response.outputs if not t.in_shared_memory]
        block, inline, described = descriptors.place(placed, self.responses)
        in_memory = [
            (t.name, t.datatype.wire, tuple(t.shape), t.parameters)
            for t in response.outputs
            if t.in_shared_memory
        ]
        order = [t.name for t in response.outputs]
        return (response.model_name, response.model_version, block, inline, described,
                in_memory, order)  # fmt: skip

    # decoupled models ------------------------------------------------------------------
    def _stream(self, frame: Frame) -> None:
        """A request whose responses go back one frame each ("p", the last marked final),
        then "z" (or "e"): a decoupled model's."""
        self._unacknowledged += 1
        (_, rid, model, version, request_id, protocol, priority, timeout_us, peer, block,
         inline, inputs, outputs, streaming, empty_final, sequence, traced) = frame  # fmt: skip
        self.handed_over += 1
        self.handoffs += 1
        try:
            request = self._request(model, version, request_id, protocol, priority, timeout_us,
                                    block, inline, inputs, outputs)  # fmt: skip
            request.empty_final = empty_final
            if sequence is not None:  # (a decoupled ensemble's sequence steps take it)
                request.sequence = SequenceFlags(*sequence)
            if any(tensor.parameters for tensor in request.inputs):
                request = self.plane.decode(lambda: request, model, version, protocol, peer)
        except BatchserveError as exc:
            self._answer_error(rid, exc)
            return
        relay = self._relay(rid, request, streaming)
        steps = None
        if traced & trace_records.STEPS:  # traced: a decoupled ensemble's steps too
            steps = trace_records.ForwardedSteps(traced, request.id)
            with steps.entered():  # (the task takes its context as it is now)
                task = asyncio.get_running_loop().create_task(relay)
        else:
            task = asyncio.get_running_loop().create_task(relay)
        self._pending[rid] = task
        task.add_done_callback(partial(self._relayed, rid, steps))

    async def _relay(self, rid: int, request: InferRequest, streaming: bool) -> None:
        credit = self._credit[rid] = asyncio.Semaphore(STREAM_CREDIT)
        try:
            async for response in self.plane.respond(request, streaming):
                await credit.acquire()  # the responder waits while the client reads slowly
                self.send(("p", rid, *self._placed(response), response.final))
        finally:
            del self._credit[rid]

    def _credited(self, frame: Frame) -> None:
        """The worker's client took ``frame[2]`` responses of request ``frame[1]``."""
        credit = self._credit.get(frame[1])
        if credit is not None:
            for _ in range(frame[2]):
                credit.release()

    def _relayed(
        self, rid: int, steps: trace_records.ForwardedSteps | None, task: asyncio.Task[None]
    ) -> None:
        """The end of a stream ("z"), with ``steps``' records where the worker traces the
        request (the steps of a decoupled ensemble)."""
        if self._pending.pop(rid, None) is None:
            return  # the worker went away
        if task.cancelled():
            self.send(("e", rid, "Cancelled", "request cancelled"))
        elif (error := task.exception()) is not None:
            self._answer_error(rid, error, steps)
        else:
            self.send(("z", rid, steps.records() if steps is not None else ()))

    def _answer_error(
        self, rid: int, error: BaseException, steps: trace_records.ForwardedSteps | None = None
    ) -> None:
        """``steps``: those a traced request ran before it failed, for its trace."""
        frame = ("e", rid, *error_frame(error))
        self.send(frame if steps is None else (*frame, steps.records()))

    def _release(self, frame: Frame) -> None:
        free = self.responses.ring.free
        for offset in frame[1]:
            free(offset)

    # bookkeeping ---------------------------------------------------------------------
    def _malformed(self, frame: Frame) -> None:
        _, model, version, protocol, name, message = frame
        error = error_from(name, message)
        if isinstance(error, InvalidArgument | Unsupported) or name == "NotFound":
            self.plane.record_malformed(model, version, protocol, error)

    def _query(self, frame: Frame) -> None:
        """A worker asks for a model's configuration, to decode and validate its requests."""
        _, model, version = frame
        served = self.plane.served_or_none(model, version)
        if served is None:
            self.send(("m", model, version, None, 0, 0, 0))
        else:
            config = served.config.SerializeToString()
            policy = served.batcher.policy
            generation = served.schema.generation
            self.send((
                "m", model, version, config, generation, policy.max_batch_size,
                policy.max_batch_steps,
            ))  # fmt: skip

    def _answered_check(self, frame: Frame) -> None:
        self.heard = time.monotonic()

    def _listening(self, frame: Frame) -> None:
        self.heard = time.monotonic()
        if not self.listening.done():
            self.listening.set_result(None)

    def _counted(self, frame: Frame) -> None:
        self._counts(self.index, frame)
        asked = self._counts_asked.get(frame[3])
        if asked is not None and not asked.done():
            asked.set_result(None)

    async def fresh_counts(self) -> None:
        """Ask the worker for its counts now and wait until they are in: what it refused
        before the question is in them."""
        if not self.protocol.connected:
            return
        number = next(self._questions)
        asked = asyncio.get_running_loop().create_future()
        self._counts_asked[number] = asked
        self.send(("n", number))
        try:
            await asked
        finally:
            del self._counts_asked[number]
