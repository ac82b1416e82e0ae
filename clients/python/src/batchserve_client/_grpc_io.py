"""Sending gRPC requests: one channel (one HTTP/2 connection) per batchserve client, and
gRPC status codes as the library's errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from batchserve_client._grpc import GrpcRequest
from batchserve_client.errors import BatchserveClientError, from_grpc_code

Metadata = tuple[tuple[str, str], ...]


def channel_options(connect_timeout: float, max_backoff: float) -> list[tuple[str, Any]]:
    """No message size limits; a connection attempt ends after ``connect_timeout`` (gRPC's
    default is 20 s: this option sets it, measured here) and the channel tries to
    reconnect at least every ``max_backoff``, so that the client's retries find it back."""
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.min_reconnect_backoff_ms", max(100, round(connect_timeout * 1000))),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", max(100, round(max_backoff * 1000))),
    ]


def _error(error: grpc.RpcError, target: str) -> BatchserveClientError:
    if isinstance(error, grpc.Call | grpc.aio.AioRpcError):
        details = error.details() or f"{error.code().name} from {target}"
        return from_grpc_code(error.code().name, details)
    return from_grpc_code("UNKNOWN", f"gRPC call to {target} failed: {error!r}")


class GrpcRunner:
    """Sends requests over one ``grpc.Channel``."""

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
        metadata: Metadata,
    ) -> None:
        self._target, self._metadata = target, metadata
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable[Message, Message]] = {}

    def send(self, request: GrpcRequest, timeout: float | None) -> Message:
        method = self._methods.get(request.path)
        if method is None:
            method = self._channel.unary_unary(
                request.path,
                request_serializer=type(request.message).SerializeToString,
                response_deserializer=request.response_type.FromString,
            )
            self._methods[request.path] = method
        try:
            return method(request.message, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise _error(error, self._target) from None

    def close(self) -> None:
        self._channel.close()


class AsyncGrpcRunner:
    """Sends requests over one ``grpc.aio.Channel``, opened in the event loop of the
    first call (an aio channel belongs to the loop it was made in)."""

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
        metadata: Metadata,
    ) -> None:
        self._target, self._credentials = target, credentials
        self._options, self._metadata = list(options), metadata
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[Message, Message]] = {}

    def _open(self) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(self._target, self._credentials, options=self._options)
        return grpc.aio.insecure_channel(self._target, options=self._options)

    async def send(self, request: GrpcRequest, timeout: float | None) -> Message:
        if self._channel is None:
            self._channel = self._open()
        method = self._methods.get(request.path)
        if method is None:
            method = self._channel.unary_unary(
                request.path,
                request_serializer=type(request.message).SerializeToString,
                response_deserializer=request.response_type.FromString,
            )
            self._methods[request.path] = method
        try:
            response: Message = await method(
                request.message, timeout=timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise _error(error, self._target) from None
        return response

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
