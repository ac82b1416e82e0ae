"""Triton's restricted protocols over gRPC (``--grpc-restricted-protocol``): a call to a
method of a restricted group without the metadata ``triton-grpc-protocol-<key>: <value>``
is refused in Triton's words before its message is read.

Triton answers UNAVAILABLE, which clients read as "try again"; this is PERMISSION_DENIED,
as retrying without the header cannot help.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import grpc

from batchserve.core.restrictions import Restriction
from batchserve.grpc.forward import Handler

_SERVICE: Final = "/inference.GRPCInferenceService/"
_HEALTH: Final = "/grpc.health.v1.Health/"
METHOD_CATEGORIES: Final[Mapping[str, str]] = {
    **{_SERVICE + m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{_HEALTH + m: "health" for m in ("Check", "Watch")},
    **{_SERVICE + m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{_SERVICE + m: "inference" for m in ("ModelInfer", "ModelStreamInfer")},
    _SERVICE + "ModelConfig": "model-config",
    _SERVICE + "ModelStatistics": "statistics",
    **{
        _SERVICE + m: "model-repository"
        for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
    },
    **{
        f"{_SERVICE}{kind}SharedMemory{call}": "shared-memory"
        for kind in ("System", "Cuda")
        for call in ("Status", "Register", "Unregister")
    },
    _SERVICE + "TraceSetting": "trace",
    _SERVICE + "LogSettings": "logging",
}
"""Each method's group, as Triton's gRPC server assigns them (standard health checking is
Triton's health group too)."""


class RestrictionInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses calls to restricted methods that do not carry their group's metadata."""

    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self._wanted = {
            method: restrictions[category]
            for method, category in METHOD_CATEGORIES.items()
            if category in restrictions
        }

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        wanted = self._wanted.get(handler_call_details.method)
        if wanted is None or handler is None:
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        if next((v for k, v in metadata if k == wanted.header), None) == wanted.value:
            return handler
        return _refusing(handler, wanted.refusal("protocol"))


def _refusing(handler: Handler, message: str) -> Handler:
    """A handler of the method's kind that aborts without reading the request."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

    def unread(_data: bytes) -> None:
        return None

    streaming_in, streaming_out = handler.request_streaming, handler.response_streaming
    if streaming_in and streaming_out:
        return grpc.stream_stream_rpc_method_handler(refuse, request_deserializer=unread)
    if streaming_out:
        return grpc.unary_stream_rpc_method_handler(refuse, request_deserializer=unread)
    if streaming_in:
        return grpc.stream_unary_rpc_method_handler(refuse, request_deserializer=unread)
    return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=unread)
