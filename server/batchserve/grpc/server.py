"""The grpc.aio server: the inference service, standard health checking and reflection."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from batchserve.core.settings import Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.grpc.call_limit import CallLimit
from batchserve.grpc.connection_watch import HandshakeTimeoutWatch
from batchserve.grpc.options import server_options
from batchserve.grpc.servicer import ErrorInterceptor, InferenceServicer
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class GrpcServer:
    """Owns the grpc.aio server and the health status it reports."""

    def __init__(self, dataplane: DataPlane, settings: Settings) -> None:
        self.calls = CallLimit(settings.grpc_max_concurrent_calls)
        self.server = grpc.aio.server(
            interceptors=[ErrorInterceptor(self.calls)], options=server_options(settings)
        )
        self.servicer = InferenceServicer(dataplane)
        self._watch = HandshakeTimeoutWatch(settings.grpc_handshake_timeout_ms / 1000)
        self._watching: asyncio.Task[None] | None = None
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        address = f"{settings.host}:{settings.grpc_port}"
        if settings.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, settings.tls.grpc_credentials())

    async def start(self) -> None:
        await self.server.start()
        self._watching = asyncio.create_task(self._watch.run(), name="grpc-handshake-watch")

    async def set_serving(self, serving: bool) -> None:
        """Mirror the server's readiness in the standard health service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls at once; let those in flight finish within the grace period.

        Streams end as soon as they owe no answer: an idle one would otherwise hold the
        stop for the whole grace period."""
        self.servicer.streams.drain()
        await self.server.stop(grace_seconds)
        if self._watching is not None:
            self._watching.cancel()
