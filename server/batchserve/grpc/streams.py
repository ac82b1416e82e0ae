"""ModelStreamInfer calls: the requests of one stream run concurrently, each answer carries
its request's id, and a drain ends every stream as soon as it owes no answer.

A stream holds at most ``STREAM_WINDOW`` responses its client has not yet taken: past that,
the requests' response iterators wait (a decoupled model's responder is not advanced) until
grpc has written what is queued, which it does as fast as the client reads (HTTP/2 flow
control). Unbounded, one request to square_int32 for 100,000,000 responses from a client that
read none grew the server by gigabytes in seconds. And a stream runs at most
``STREAM_REQUESTS`` requests at once: past that it reads no more until one is answered, and
the client's sends wait in its own buffers. Unbounded, 200,000 requests sent down one stream
whose client read nothing held 1.2 GB (each answered request waits with its response).

grpc.aio's stop(grace) waits for every call to end, and a stream's call ends only when its
client closes it: one idle stream held each shutdown for the whole grace period. So the
streams are known here, and ``drain`` ends them: an idle one at once, a busy one once its
requests are answered, both with UNAVAILABLE and Triton's "GRPC server is shutting down ..."
(not OK: a client must not take the server's leaving for the end of its own requests, and
UNAVAILABLE is the code clients reconnect and retry on). A request arriving on a stream while
it drains is answered in the stream with that message, not run; and so is one that arrives
once the server's intake has closed (``core/intake.py``), from the stop signal on, before the
drain reaches the streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from enum import Enum
from typing import Any

import grpc

from batchserve.core.errors import Unavailable, public_message
from batchserve.core.intake import Intake
from batchserve.grpc.failures import report_failure
from batchserve.grpc.head import Request
from batchserve.observability.refusals import REFUSALS, Protocol
from batchserve.proto import grpc_service_pb2 as pb

Infer = Callable[[Request], AsyncGenerator[pb.ModelInferResponse, None]]
"""A request's responses: one, or a decoupled model's any number."""
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
"""Triton's words (its stream and infer handlers'), for a request a draining stream refuses."""
STREAM_WINDOW = 32
"""Responses a stream queues ahead of its client, over all its requests."""
STREAM_REQUESTS = 256
"""Requests a stream runs at once. Clients that pipeline on one stream (perf_analyzer's
streaming mode, a sequence's steps) keep a few dozen in flight."""


class _Signal(Enum):
    DRAIN = "drain"
    """Put in every open stream's answers when the drain starts, to wake an idle one."""


class _Bound:
    """At most ``limit`` held at once, the next ones waiting in turn: a semaphore whose
    free case, every response's on a stream read at pace, is a comparison rather than a
    coroutine (``asyncio.Semaphore.acquire``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    def take(self) -> asyncio.Future[None] | None:
        """Hold one now (None), or the turn to ``wait`` for while all are held."""
        if self.held < self.limit:
            self.held += 1
            return None
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        return turn

    async def wait(self, turn: asyncio.Future[None]) -> None:
        """Hold one once ``turn`` comes."""
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give()  # handed over as it was cancelled: pass it on
            elif turn in self._waiting:  # (``give`` skips and drops cancelled turns)
                self._waiting.remove(turn)
            raise

    def give(self) -> None:
        """Free one: the longest waiting holds it now."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.held -= 1


class _Stream:
    """One call's queue of answers and its requests still running."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[tuple[pb.ModelStreamInferResponse, bool] | _Signal | None]
        self.answers = asyncio.Queue()
        """Each answer, with whether it is a response (it holds ``room``) or an error or
        signal (one per request at most)."""
        self.room = _Bound(STREAM_WINDOW)
        """Responses queued or being written."""
        self.running = _Bound(STREAM_REQUESTS)
        """Requests read and not yet answered."""

    def owes_nothing(self) -> bool:
        return self.running.held == 0 and self.answers.empty()


class InferStreams:
    """The open ModelStreamInfer calls, so that a drain can end them."""

    def __init__(self, intake: Intake | None = None) -> None:
        self.draining = False
        self.intake = intake or Intake()
        """The server's: closed, new streams and requests are refused before the drain."""
        self._open: set[_Stream] = set()

    def drain(self) -> None:
        """Refuse new streams and requests from now on; wake the open streams to end."""
        self.draining = True
        for stream in self._open:
            stream.answers.put_nowait(_Signal.DRAIN)

    async def serve(
        self,
        requests: AsyncIterator[Request],
        infer: Infer,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        stream = _Stream()
        if self.draining or not self.intake.open:
            REFUSALS.count_error(Protocol.GRPC, Unavailable(SHUTTING_DOWN))
            _end_for_shutdown(context)
            return
        self._open.add(stream)
        reader = asyncio.get_running_loop().create_task(self._read(requests, infer, stream))
        try:
            while (answer := await stream.answers.get()) is not None:
                if answer is not _Signal.DRAIN:
                    message, held = answer
                    yield message
                    if held:
                        stream.room.give()
                if self.draining and stream.owes_nothing():
                    _end_for_shutdown(context)
                    return
        finally:
            self._open.discard(stream)
            reader.cancel()

    async def _read(self, requests: AsyncIterator[Request], infer: Infer, stream: _Stream) -> None:
        running: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                if self.draining or not self.intake.open:
                    refused = Unavailable(SHUTTING_DOWN)
                    REFUSALS.count_error(Protocol.GRPC, refused)
                    stream.answers.put_nowait((_error_answer(refused, request.id), False))
                    continue
                if (turn := stream.running.take()) is not None:  # read on once one ends
                    await stream.running.wait(turn)
                task = asyncio.get_running_loop().create_task(_answer(request, infer, stream))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(set(running))
        except asyncio.CancelledError:  # the client cancelled the stream: drop its queued work
            for task in running:
                task.cancel()
            raise
        finally:
            stream.answers.put_nowait(None)


async def _answer(request: Request, infer: Infer, stream: _Stream) -> None:
    """Queue each response as it comes; the running count drops with the last one queued
    in the same step, so the stream never owes nothing early."""
    try:
        async with contextlib.aclosing(infer(request)) as responses:  # closed if cancelled
            async for response in responses:
                if (turn := stream.room.take()) is not None:  # once the client takes one
                    await stream.room.wait(turn)
                answer = pb.ModelStreamInferResponse(infer_response=response)
                stream.answers.put_nowait((answer, True))
    except Exception as exc:
        report_failure(exc)
        stream.answers.put_nowait((_error_answer(exc, request.id), False))
    finally:
        stream.running.give()


def _error_answer(error: BaseException, request_id: str = "") -> pb.ModelStreamInferResponse:
    """Triton's error in a stream: the message, and the id of the request that failed."""
    return pb.ModelStreamInferResponse(
        error_message=public_message(error),
        infer_response=pb.ModelInferResponse(id=request_id) if request_id else None,
    )


def _end_for_shutdown(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    context.set_code(grpc.StatusCode.UNAVAILABLE)
    context.set_details(SHUTTING_DOWN)
