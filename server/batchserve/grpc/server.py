"""The grpc.aio servers: the inference service, standard health checking and reflection in
a single-process server (and on the model-owning process's socket for its workers); in a
worker, inference with every other call forwarded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from batchserve.core.addresses import host_port
from batchserve.core.errors import CannotStart
from batchserve.core.intake import Intake
from batchserve.core.settings import Settings
from batchserve.dataplane.inference_path import KnownModels
from batchserve.dataplane.plane import DataPlane
from batchserve.grpc.accepts import ParallelAccepts
from batchserve.grpc.call_limit import CallLimit
from batchserve.grpc.connection_watch import HandshakeTimeoutWatch
from batchserve.grpc.forward import (
    Forwarder,
    Handler,
    InternalServicer,
    WorkerHandlers,
    WorkerServicer,
)
from batchserve.grpc.head import METHODS
from batchserve.grpc.options import server_options
from batchserve.grpc.restricted import RestrictionInterceptor
from batchserve.grpc.servicer import ErrorInterceptor, InferenceServicer
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class _Registrations:
    """A grpc.aio server as generated code registers with it, remembering each registered
    method's handler by its full name."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.handlers: dict[str, Handler] = {}

    def add_generic_rpc_handlers(
        self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._server.add_generic_rpc_handlers(tuple(handlers))

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Handler]) -> None:
        # grpcio 1.85's method; grpc-stubs do not have it yet
        cast(Any, self._server).add_registered_method_handlers(service, dict(handlers))
        self.handlers.update({f"/{service}/{name}": h for name, h in handlers.items()})


class _Listener:
    """A grpc.aio server under the call limit, its handshake watch, its graceful stop, and
    more than one call accepted at a time (``accepts.py``)."""

    def __init__(
        self, settings: Settings, servicer: InferenceServicer, reuse_port: bool, public: bool
    ) -> None:
        """``public``: the listener clients reach, where ``--grpc-restricted-protocol``
        applies (not the model-owning process's socket for its workers)."""
        self.calls = CallLimit(settings.grpc_max_concurrent_calls)
        interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = [ErrorInterceptor(self.calls)]
        restrictions = settings.grpc_restrictions() if public else {}
        if restrictions:  # first: a refused call is never read
            interceptors.insert(0, RestrictionInterceptor(restrictions))
        self.server = grpc.aio.server(
            interceptors=interceptors, options=server_options(settings, reuse_port)
        )
        self.registrations = _Registrations(self.server)
        self.servicer = servicer
        self.accepts = ParallelAccepts(self.server, interceptors, settings.grpc_accept_pipelines)
        self._watch = HandshakeTimeoutWatch(settings.grpc_handshake_timeout_ms / 1000)
        self._watching: asyncio.Task[None] | None = None
        self.port = 0

    def listen(self, settings: Settings, port: int) -> None:
        """Serve ``port`` on the gRPC address (``--grpc-address``, else ``--host``), with TLS
        when configured."""
        address = host_port(settings.grpc_host(), port)
        try:
            tls = settings.grpc_tls
            if tls is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError:  # grpc says no more than that the bind failed
            raise CannotStart(
                f"cannot serve gRPC on {address}: the port is taken, or the address is not "
                "this host's"
            ) from None

    async def start(self) -> None:
        await self.server.start()
        hot = METHODS[0]  # unary inference: a stream is accepted once for many requests
        self.accepts.start({hot: self.registrations.handlers[hot]})
        self._watching = asyncio.create_task(self._watch.run(), name="grpc-handshake-watch")

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls at once; let those in flight finish within the grace period.

        Streams end as soon as they owe no answer: an idle one would otherwise hold the
        stop for the whole grace period."""
        self.servicer.streams.drain()
        await self.server.stop(grace_seconds)
        await self.accepts.stop()
        if self._watching is not None:
            self._watching.cancel()


class GrpcServer(_Listener):
    """The whole service, and the health status it reports."""

    def __init__(
        self,
        dataplane: DataPlane,
        settings: Settings,
        internal_path: str | None = None,
        reuse_port: bool = False,
        intake: Intake | None = None,
    ) -> None:
        """Serves ``settings``' port, or with ``internal_path`` a Unix socket that only the
        server's workers reach (plain text; the client's address is the one they name);
        ``reuse_port``: other processes may bind the port too (``--reuse-grpc-port``);
        ``intake``: the server's, closed as its stop begins (inference refused from then)."""
        servicer = InferenceServicer if internal_path is None else InternalServicer
        super().__init__(
            settings, servicer(dataplane, intake), reuse_port=reuse_port,
            public=internal_path is None,
        )  # fmt: skip
        # the generated code calls only the two add_* methods of its server
        registrations = cast(grpc.aio.Server, self.registrations)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, registrations)
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

    def __init__(
        self, plane: KnownModels, settings: Settings, port: int, path: str, intake: Intake
    ) -> None:
        """``intake``: the worker's, which the model-owning process closes at its stop."""
        self.forwarder = Forwarder(path)
        super().__init__(
            settings, WorkerServicer(plane, self.forwarder, intake), reuse_port=True,
            public=True,
        )  # fmt: skip
        assert isinstance(self.servicer, WorkerServicer)
        handlers = WorkerHandlers(self.servicer, self.forwarder)
        # registered, so that inference calls can have more than one accept outstanding
        local = {name.rsplit("/", 1)[1]: handlers.local[name] for name in METHODS}
        self.registrations.add_registered_method_handlers(SERVICE_NAME, local)
        self.server.add_generic_rpc_handlers([handlers])
        self.listen(settings, port)

    async def stop(self, grace_seconds: float) -> None:
        await super().stop(grace_seconds)
        await self.forwarder.close()
