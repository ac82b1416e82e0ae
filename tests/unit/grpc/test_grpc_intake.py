"""Once the server's intake has closed (its stop has begun), gRPC inference is refused as
Triton's handlers refuse it: UNAVAILABLE and "GRPC server is shutting down and has stopped
accepting new requests.", a unary call as its status, a stream's request in the stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from batchserve.core.errors import Unavailable
from batchserve.core.intake import Intake
from batchserve.grpc.head import Request
from batchserve.grpc.servicer import InferenceServicer
from batchserve.grpc.streams import SHUTTING_DOWN, InferStreams
from batchserve.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.anyio


class _Context:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


async def _infer(request: Any) -> AsyncIterator[pb.ModelInferResponse]:
    yield pb.ModelInferResponse(model_name="m", id=request.id)


async def test_a_unary_call_is_refused_in_tritons_words() -> None:
    intake = Intake()
    dataplane = SimpleNamespace(control=None, regions=None)
    servicer = InferenceServicer(dataplane, intake)  # type: ignore[arg-type]
    assert servicer.streams.intake is intake
    intake.close()
    with pytest.raises(Unavailable) as refused:
        await servicer.ModelInfer(pb.ModelInferRequest(model_name="m"), _Context())  # type: ignore[arg-type]
    assert refused.value.message == SHUTTING_DOWN


async def test_a_stream_refuses_the_requests_that_come_once_the_intake_has_closed() -> None:
    intake = Intake()
    streams = InferStreams(intake)
    context = _Context()

    async def requests() -> AsyncIterator[Request]:
        yield pb.ModelInferRequest(model_name="m", id="before")
        intake.close()
        yield pb.ModelInferRequest(model_name="m", id="after")

    answers = [a async for a in streams.serve(requests(), _infer, context)]  # type: ignore[arg-type]
    by_id = {a.infer_response.id: a.error_message for a in answers}
    assert by_id == {"before": "", "after": SHUTTING_DOWN}  # its id, as Triton names it
    assert context.code is None  # the stream ends as its client ends it, as before a drain


async def test_a_stream_opened_once_the_intake_has_closed_ends_unavailable() -> None:
    intake = Intake()
    intake.close()
    context = _Context()
    requests = AsyncIteratorOf(pb.ModelInferRequest(model_name="m", id="1"))
    answers = [a async for a in InferStreams(intake).serve(requests, _infer, context)]  # type: ignore[arg-type]
    assert answers == []
    assert (context.code, context.details) == (grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)


class AsyncIteratorOf:
    def __init__(self, *items: Request) -> None:
        self._items = list(items)

    def __aiter__(self) -> AsyncIteratorOf:
        return self

    async def __anext__(self) -> Request:
        if not self._items:
            raise StopAsyncIteration
        return self._items.pop(0)
