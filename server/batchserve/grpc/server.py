"""The grpc.aio servers: the inference service, standard health checking and reflection in
a single-process server (and on the model-owning process's socket for its workers); in a
worker, inference with every other call forwarded."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from batchserve.core.settings import Settings
from batchserve.dataplane.inference_path import KnownModels
from batchserve.dataplane.plane import DataPlane
from batchserve.grpc.call_limit import CallLimit
from batchserve.grpc.connection_watch import HandshakeTimeoutWatch
from batchserve.grpc.forward import (
    Forwarder,
    InternalServicer,
    WorkerHandlers,
    WorkerServicer,
)
from batchserve.grpc.options import server_options
from batchserve.grpc.servicer import ErrorInterceptor, InferenceServicer
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class _Listener:
    """A grpc.aio server under the call limit, its handshake watch, its graceful stop."""

    def __init__(self, settings: Settings, servicer: InferenceServicer, reuse_port: bool) -> None:
        self.calls = CallLimit(settings.grpc_max_concurrent_calls)
        self.server = grpc.aio.server(
            interceptors=[ErrorInterceptor(self.calls)],
            options=server_options(settings, reuse_port),
        )
        self.servicer = servicer
        self._watch = HandshakeTimeoutWatch(settings.grpc_handshake_timeout_ms / 1000)
        self._watching: asyncio.Task[None] | None = None
        self.port = 0

    def listen(self, settings: Settings, port: int) -> None:
        """Serve ``port`` on ``settings.host``, with TLS when configured."""
        address = f"{settings.host}:{port}"
        if settings.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, settings.tls.grpc_credentials())

    async def start(self) -> None:
        await self.server.start()
        self._watching = asyncio.create_task(self._watch.run(), name="grpc-handshake-watch")

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls at once; let those in flight finish within the grace period.

        Streams end as soon as they owe no answer: an idle one would otherwise hold the
        stop for the whole grace period."""
        self.servicer.streams.drain()
        await self.server.stop(grace_seconds)
        if self._watching is not None:
            self._watching.cancel()


class GrpcServer(_Listener):
    """The whole service, and the health status it reports."""

    def __init__(
        self, dataplane: DataPlane, settings: Settings, internal_path: str | None = None
    ) -> None:
        """Serves ``settings``' port, or with ``internal_path`` a Unix socket that only the
        server's workers reach (plain text; the client's address is the one they name)."""
        servicer = InferenceServicer if internal_path is None else InternalServicer
        super().__init__(settings, servicer(dataplane), reuse_port=False)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        if internal_path is None:
            self.listen(settings, settings.grpc_port)
        else:
            self.port = self.server.add_insecure_port(f"unix:{internal_path}")

    async def set_serving(self, serving: bool) -> None:
        """Mirror the server's readiness in the standard health service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)


class WorkerGrpcServer(_Listener):
    """A worker's share of the gRPC port: inference here, the rest forwarded."""

    def __init__(self, plane: KnownModels, settings: Settings, port: int, path: str) -> None:
        self.forwarder = Forwarder(path)
        super().__init__(settings, WorkerServicer(plane, self.forwarder), reuse_port=True)
        assert isinstance(self.servicer, WorkerServicer)
        self.server.add_generic_rpc_handlers([WorkerHandlers(self.servicer, self.forwarder)])
        self.listen(settings, port)

    async def stop(self, grace_seconds: float) -> None:
        await super().stop(grace_seconds)
        await self.forwarder.close()
