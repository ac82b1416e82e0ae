"""A worker's gRPC calls that the model-owning process answers: every method but inference
goes there whole, over a Unix socket, as the bytes that arrived; inference does too for a
model the worker does not know yet. The client's address travels as metadata, which only
the model-owning process's own listener (``InternalServicer``) believes."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeAlias

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from batchserve.core import errors
from batchserve.core.errors import BatchserveError
from batchserve.core.intake import Intake
from batchserve.core.request_memory import Ticket
from batchserve.dataplane.inference_path import KnownModels
from batchserve.grpc.head import METHODS, Request, read
from batchserve.grpc.layout_cache import MessageLayouts
from batchserve.grpc.servicer import FINAL_RESPONSE, Context, InferenceServicer
from batchserve.grpc.streams import InferStreams
from batchserve.observability.request_trace import RequestTrace
from batchserve.proto import grpc_service_pb2 as pb

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
PEER_KEY = "x-batchserve-peer"
"""Metadata naming the client a worker forwards a call for."""

_FORWARDED_SERVICES = (
    pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
)
_STATUS_ERRORS: dict[grpc.StatusCode, type[BatchserveError]] = {
    code: kind
    for kind, code in reversed(list(errors.GRPC_STATUS.items()))
    if isinstance(kind, type) and issubclass(kind, BatchserveError)
}


def _methods() -> dict[str, tuple[bool, bool]]:
    """Every forwarded method's path, with (client streaming, server streaming)."""
    return {
        f"/{service.full_name}/{method.name}": (method.client_streaming, method.server_streaming)
        for service in _FORWARDED_SERVICES
        for method in service.methods
    }


def _metadata(context: Context) -> list[tuple[str, str | bytes]]:
    kept = [(k, v) for k, v in context.invocation_metadata() or () if k != PEER_KEY]
    return [*kept, (PEER_KEY, context.peer())]


class Forwarder:
    """Calls the model-owning process's gRPC listener with the caller's bytes and metadata."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            f"unix:{socket_path}",
            options=[("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1)],
        )  # fmt: skip
        self._methods = _methods()

    def handler(self, method: str) -> Handler | None:
        shape = self._methods.get(method)
        if shape is None:
            return None
        client_streaming, server_streaming = shape
        if client_streaming:
            return self._bidi(method)
        return self._server_stream(method) if server_streaming else self._unary(method)

    def _unary(self, method: str) -> Handler:
        call = self.channel.unary_unary(method, None, None)

        async def unary(request: bytes, context: Context) -> bytes:
            try:
                answer: bytes = await call(request, metadata=_metadata(context),
                                           timeout=context.time_remaining())  # fmt: skip
            except grpc.aio.AioRpcError as error:
                await _abort(context, error)
            return answer

        return grpc.unary_unary_rpc_method_handler(unary)

    def _server_stream(self, method: str) -> Handler:
        call = self.channel.unary_stream(method, None, None)

        async def server_stream(request: bytes, context: Context) -> AsyncIterator[bytes]:
            try:
                async for answer in call(request, metadata=_metadata(context)):
                    yield answer
            except grpc.aio.AioRpcError as error:
                await _abort(context, error)

        return grpc.unary_stream_rpc_method_handler(server_stream)

    def _bidi(self, method: str) -> Handler:
        call = self.channel.stream_stream(method, None, None)

        async def bidi(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
            try:
                async for answer in call(requests, metadata=_metadata(context)):
                    yield answer
            except grpc.aio.AioRpcError as error:
                await _abort(context, error)

        return grpc.stream_stream_rpc_method_handler(bidi)

    async def infer(self, request: Request, peer: str) -> pb.ModelInferResponse:
        """One inference request, answered by the model-owning process; its error raised
        as the batchserve error of the same status."""
        call = self.channel.unary_unary(METHODS[0], None, pb.ModelInferResponse.FromString)
        try:
            answer: pb.ModelInferResponse = await call(
                request.SerializeToString(), metadata=[(PEER_KEY, peer)]
            )
        except grpc.aio.AioRpcError as error:
            kind = _STATUS_ERRORS.get(error.code(), errors.Internal)
            raise kind(error.details() or "") from None
        return answer

    async def close(self) -> None:
        await self.channel.close(None)


async def _abort(context: Context, error: grpc.aio.AioRpcError) -> None:
    trailing = tuple(error.trailing_metadata() or ())
    await context.abort(error.code(), error.details() or "", trailing)  # type: ignore[arg-type]


class WorkerServicer(InferenceServicer):
    """A worker's inference calls: decoded here and handed off (``WorkerPlane``)."""

    def __init__(self, plane: KnownModels, forwarder: Forwarder, intake: Intake) -> None:
        # Not InferenceServicer.__init__: control and regions live in the other process.
        self.inference = plane
        self.plane = plane
        self.layouts = MessageLayouts()
        self.intake = intake  # closed by the model-owning process, the stop signal's
        self.streams = InferStreams(self.intake)
        self.forwarder = forwarder

    async def _decodes_here(self, request: Request) -> bool:
        """Whether this worker knows the model (else the request goes there whole)."""
        model, version = request.model_name, request.model_version
        return self.plane.knows(model, version) or await self.plane.learn(model, version)

    async def _infer(
        self, request: Request, peer: str | None, ticket: Ticket
    ) -> pb.ModelInferResponse:
        if await self._decodes_here(request):
            return await super()._infer(request, peer, ticket)
        # Forwarded whole: the model-owning process counts it while it answers.
        return await self.forwarder.infer(request, peer or "")

    async def _responses(
        self, request: Request, peer: str | None, trace: RequestTrace | None
    ) -> AsyncGenerator[pb.ModelInferResponse, None]:
        if await self._decodes_here(request):
            async for response in super()._responses(request, peer, trace):
                yield response
            return
        answer = await self.forwarder.infer(request, peer or "")  # its error, as there
        answer.parameters[FINAL_RESPONSE].bool_param = True
        yield answer


class WorkerHandlers(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Inference served here, every other method forwarded."""

    def __init__(self, servicer: WorkerServicer, forwarder: Forwarder) -> None:
        self.local: dict[str, Handler] = {
            METHODS[0]: grpc.unary_unary_rpc_method_handler(
                servicer.ModelInfer, request_deserializer=read,
                response_serializer=pb.ModelInferResponse.SerializeToString,
            ),
            METHODS[1]: grpc.stream_stream_rpc_method_handler(
                servicer.ModelStreamInfer, request_deserializer=read,
                response_serializer=pb.ModelStreamInferResponse.SerializeToString,
            ),
        }  # fmt: skip
        self._forwarder = forwarder

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        method = handler_call_details.method
        local = self.local.get(method)
        return local if local is not None else self._forwarder.handler(method)


class InternalServicer(InferenceServicer):
    """The model-owning process's listener for its workers: the client's address is the
    one the worker names."""

    def peer(self, context: Context) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == PEER_KEY and isinstance(value, str):
                return value
        return ""
