"""ModelStreamInfer: a failed request is answered in the stream, and logged as the unary
methods log it (an unexpected error at ERROR with its traceback, a client's error not)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.grpc.head import Request
from batchserve.grpc.streams import STREAM_REQUESTS, STREAM_WINDOW, InferStreams, _Bound
from batchserve.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.anyio


async def _requests(*ids: str) -> AsyncIterator[Request]:
    for request_id in ids:
        yield pb.ModelInferRequest(model_name="m", id=request_id)


async def _infer(request: Any) -> AsyncIterator[pb.ModelInferResponse]:
    if request.id == "bug":
        raise RuntimeError("a bug")
    if request.id == "bad":
        raise InvalidArgument("the client's mistake")
    yield pb.ModelInferResponse(model_name="m", id=request.id)


async def _answers(*ids: str) -> dict[str, str]:
    """Each answer's id (an error's too, as Triton sends it) and its error message."""
    answers = InferStreams().serve(_requests(*ids), _infer, SimpleNamespace())  # type: ignore[arg-type]
    return {answer.infer_response.id: answer.error_message async for answer in answers}


async def test_an_unexpected_error_is_answered_and_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="batchserve.grpc"):
        answers = await _answers("ok", "bug")
    assert answers == {"ok": "", "bug": "internal error: RuntimeError"}
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "a bug"


async def test_a_clients_error_is_answered_but_not_logged_as_the_servers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="batchserve.grpc"):
        answers = await _answers("bad", "ok")
    assert answers == {"bad": "the client's mistake", "ok": ""}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_bound_hands_its_places_over_in_turn_and_passes_on_a_cancelled_turn() -> None:
    """The stream's bounds (responses queued ahead of the client, requests running)."""
    bound = _Bound(2)
    assert bound.take() is None
    assert bound.take() is None
    turns = [bound.take() for _ in range(3)]
    assert all(turn is not None for turn in turns)
    waits = [asyncio.ensure_future(bound.wait(turn)) for turn in turns if turn is not None]
    await asyncio.sleep(0)
    waits[1].cancel()
    bound.give()  # to the first in line
    await asyncio.sleep(0)
    assert waits[0].done()
    assert waits[1].cancelled()
    assert not waits[2].done()
    bound.give()  # the cancelled turn is skipped
    await asyncio.sleep(0)
    assert waits[2].done()
    assert bound.held == 2
    late = bound.take()
    after = bound.take()
    assert late is not None
    assert after is not None
    late_wait = asyncio.ensure_future(bound.wait(late))
    after_wait = asyncio.ensure_future(bound.wait(after))
    await asyncio.sleep(0)
    bound.give()  # handed to a turn cancelled in the same pass: it goes on to the next
    late_wait.cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert late_wait.cancelled()
    assert after_wait.done()
    assert bound.held == 2
    bound.give()
    bound.give()
    assert bound.held == 0


async def _many(request: Any) -> AsyncIterator[pb.ModelInferResponse]:
    for index in range(100):
        yield pb.ModelInferResponse(model_name="m", id=f"{request.id}-{index}")


async def test_a_stream_queues_no_more_than_its_window_ahead_of_its_reader() -> None:
    """A reader that stops after one answer: the request's responses stop being made."""
    made = 0

    async def counted(request: Any) -> AsyncIterator[pb.ModelInferResponse]:
        nonlocal made
        async for response in _many(request):
            made += 1
            yield response

    answers = InferStreams().serve(_requests("r"), counted, SimpleNamespace())  # type: ignore[arg-type]
    first = await anext(answers)
    assert first.infer_response.id == "r-0"
    for _ in range(20):
        await asyncio.sleep(0)
    assert made <= STREAM_WINDOW + 2  # the window, the one taken, the one waiting for room
    rest = [answer.infer_response.id async for answer in answers]
    assert rest == [f"r-{index}" for index in range(1, 100)]


async def test_a_stream_reads_no_more_requests_than_it_runs_at_once() -> None:
    """Requests piped down a stream whose model does not answer yet: the stream stops reading
    at ``STREAM_REQUESTS`` (the rest wait in the client's buffers), then answers every one."""
    sent = STREAM_REQUESTS * 3
    read = 0
    release = asyncio.Event()

    async def piped() -> AsyncIterator[Request]:
        nonlocal read
        for index in range(sent):
            read += 1
            yield pb.ModelInferRequest(model_name="m", id=str(index))

    async def held(request: Any) -> AsyncIterator[pb.ModelInferResponse]:
        await release.wait()
        yield pb.ModelInferResponse(model_name="m", id=request.id)

    answers = InferStreams().serve(piped(), held, SimpleNamespace())  # type: ignore[arg-type]
    first = asyncio.ensure_future(anext(answers))
    for _ in range(50):
        await asyncio.sleep(0)
    assert read <= STREAM_REQUESTS + 1  # those running, and the one waiting for a place
    release.set()
    ids = [(await first).infer_response.id] + [a.infer_response.id async for a in answers]
    assert sorted(ids, key=int) == [str(index) for index in range(sent)]
