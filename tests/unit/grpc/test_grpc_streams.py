"""ModelStreamInfer: a failed request is answered in the stream, and logged as the unary
methods log it (an unexpected error at ERROR with its traceback, a client's error not)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.grpc.head import Request
from batchserve.grpc.streams import InferStreams
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
