"""One traced request, as the request path marks it, whichever mode writes it out.

The request path only marks phase boundaries (a clock read each) while a request is traced:
``receive`` (HTTP: reading and inflating the body), ``decode``, ``infer`` (the server's
work), ``encode`` and ``send``. The batcher's own timestamps on the request's work item give
its queue and compute times, so the scheduler knows nothing of tracing. When the request
ends, a mode's subclass turns the marks into OpenTelemetry spans (``tracing.py``) or
Triton's trace-file records (``trace_records.py``).
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from asyncio import Future

    from batchserve.core.types import InferRequest, InferResponse, Tensor

ComputeStamps = tuple[int, int, int, int] | tuple[()]
"""The run a request's batch went in: start, inputs gathered, model done, outputs split
(``time.monotonic_ns``); () where no run of the batcher's answered it."""
BatchTimes = tuple[int, int, int, dict[str, Any], ComputeStamps]
"""A request's times in the batcher: enqueued, dispatched, answered (0: failed), the
batch's attributes, and its run's stamps."""


class QueuedWork(Protocol):
    """What a request's trace reads from the batcher's work item (``scheduler/work.py``)."""

    batch_size: int
    executed_batch_size: int
    priority: int
    enqueued_ns: int
    dispatched_ns: int
    compute_ns: ComputeStamps
    future: Future[Any]


_current: ContextVar[RequestTrace | None] = ContextVar("batchserve_request_trace", default=None)


def current() -> RequestTrace | None:
    """The traced request this task serves, if any (set by ``RequestTracer.begin``)."""
    return _current.get()


class RequestTrace:
    """One traced request: phase boundaries on the monotonic clock, written out by a
    mode's ``finish`` when the request ends."""

    sent_at_call_end = False
    """gRPC: whether ``finish`` waits for the call's end, where the answer has been sent."""

    def __init__(self, protocol: str, model: str, tensors: bool) -> None:
        self.protocol = protocol
        self.model = model
        self.tensors = tensors
        self.token: Token[RequestTrace | None] | None = None
        self.start = self.last = time.monotonic_ns()
        self.phases: list[tuple[str, int, int]] = []
        self.item: QueuedWork | None = None
        self.batch: BatchTimes | None = None
        self.error: str | None = None
        self.failed_ns = 0
        self.response: InferResponse | None = None
        self.inputs: list[Tensor] = []
        self.request_id = ""

    def enter(self) -> None:
        """This trace becomes the current task's."""
        self.token = _current.set(self)

    def leave(self) -> None:
        """It stops being current (the handler returns). A generator closed from another
        task (a stream's request finalized after its stream ended) leaves nothing to reset."""
        if self.token is not None:
            token, self.token = self.token, None
            with contextlib.suppress(ValueError):  # set in another context
                _current.reset(token)

    def mark(self, phase: str) -> None:
        """``phase`` ended now; it began where the previous one ended."""
        now = time.monotonic_ns()
        self.phases.append((phase, self.last, now))
        self.last = now

    def failed(self, error: BaseException) -> None:
        from batchserve.core.errors import public_message

        self.failed_ns = time.monotonic_ns()
        self.error = f"{type(error).__name__}: {public_message(error)}"

    def answered(self, response: InferResponse) -> None:
        """The served model version, request id, and (level TENSORS) outputs."""
        self.response = response

    def decoded(self, request: InferRequest) -> None:
        """The request as decoded: its id (a trace names it even when it fails, as Triton's
        does) and, at level TENSORS, its inputs."""
        self.request_id = request.id
        if self.tensors:
            self.inputs = list(request.inputs)

    def watch(self, item: QueuedWork) -> None:
        """The request's work item: its batch times are taken once it is answered."""
        self.item = item
        item.future.add_done_callback(lambda future: self.executed(item, future))

    def executed(self, item: QueuedWork, future: Future[Any], now: int = 0) -> None:
        """The batcher answered the request's work item (at ``now``)."""
        now = now or time.monotonic_ns()
        ok = not future.cancelled() and future.exception() is None
        self.ran(*batch_times(item, now, ok))

    def ran(
        self,
        enqueued: int,
        dispatched: int,
        answered: int,
        attributes: dict[str, Any],
        stamps: ComputeStamps = (),
    ) -> None:
        """The batch times of ``executed``, as the model-owning process sends a worker them
        (the monotonic clock is the machine's, the same in both processes)."""
        self.batch = (enqueued, dispatched, answered, attributes, stamps)

    def settle_batch(self) -> None:
        """Where the request was answered within its own step, the item's callback has not
        run yet: its times are taken now, answered where the ``infer`` phase ended."""
        if self.batch is None and self.item is not None and self.item.future.done():
            answered = next((end for phase, _, end in self.phases if phase == "infer"), 0)
            self.executed(self.item, self.item.future, answered)

    def finish(self) -> None:
        """Write the trace out; it stops being current."""
        raise NotImplementedError


def batch_times(item: QueuedWork, now: int, ok: bool) -> BatchTimes:
    """What ``RequestTrace.ran`` takes of a work item answered ``now``: queued from its
    enqueue time to its dispatch (or to now, when it never ran), computed from dispatch to
    now (0: it failed), the batch's attributes, and its run's stamps."""
    attributes = {
        "request_batch_size": item.batch_size,
        "batch_size": item.executed_batch_size,
        "priority": item.priority,
    }
    stamps = item.compute_ns if ok else ()
    return item.enqueued_ns, item.dispatched_ns or now, now if ok else 0, attributes, stamps
