"""Composition root and lifecycle: build every part, serve, drain on SIGTERM.

HTTP (uvicorn), gRPC (grpc.aio) and metrics share one uvloop event loop. Shutdown
follows the order Kubernetes needs: not ready at once, an optional delay while load
balancers notice, stop accepting on both protocols, let accepted work finish, unload.
A signal during start-up stops loading models; a second signal skips the delay
(``stop_signals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import uvicorn
import uvloop

from batchserve.backends.selection import create_backend
from batchserve.core.errors import BatchserveError
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.core.tls import TlsFiles, TlsMode
from batchserve.dataplane.plane import DataPlane
from batchserve.devices.nvml import GpuMonitor
from batchserve.grpc.server import GrpcServer
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import BackendFactory, ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.observability.metrics import metrics_app
from batchserve.observability.refusals import Protocol
from batchserve.rest.app import build_http_app
from batchserve.rest.http_limits import protocol_for
from batchserve.rest.http_timeouts import ReadTimeouts
from batchserve.runtime import gc_tuning, malloc_tuning
from batchserve.runtime.event_loop import BoundedHandshakeLoop
from batchserve.runtime.metrics_collector import ServerCollector, metrics_registry
from batchserve.runtime.stop_signals import StopSignals
from batchserve.scheduler.memory import MemoryBudgets

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 30


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the application owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def bound_port(self) -> int:
        return int(self.servers[0].sockets[0].getsockname()[1])


def _uvicorn(
    app: Any, settings: Settings, port: int, listener: Protocol, tls: TlsFiles | None = None
) -> _Uvicorn:
    """A uvicorn server on ``port``, serving TLS when ``tls`` is given; its refusals are
    counted under ``listener``."""
    timeouts = ReadTimeouts(
        settings.http_header_timeout_seconds,
        settings.http_body_timeout_seconds,
        settings.http_body_min_rate,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=port,
        loop="none",
        http=protocol_for(listener, timeouts),
        lifespan="off",
        access_log=False,
        log_config=None,
        # Nothing reads the client's address; rewriting it from X-Forwarded-* headers
        # took ~2.5 % of the event loop under load.
        proxy_headers=False,
        server_header=False,
        # Longer than clients keep idle connections (httpx and batchserve_client: 5 s),
        # so a client never reuses a connection the server is closing at that moment.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds),
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    return _Uvicorn(config)


class Server:
    """The whole server process; ``backend_factory`` lets a test harness wrap the runtimes."""

    def __init__(
        self, settings: Settings, backend_factory: BackendFactory = create_backend
    ) -> None:
        self.settings = settings
        repository = ModelRepository(settings.model_repository)
        budgets = MemoryBudgets(settings.memory_budget, device_total_bytes)
        self.registry = ModelRegistry(repository, settings.max_queue_size, budgets,
                                      backend_factory, after_change=_settle_heap)  # fmt: skip
        self.dataplane = DataPlane(settings, self.registry, self._models_to_load(repository))
        self.http = _uvicorn(build_http_app(self.dataplane, settings), settings,
                             settings.http_port, Protocol.HTTP, settings.tls)  # fmt: skip
        self.gpus = GpuMonitor.open()
        collector = ServerCollector(self.registry, self.gpus, self.registry.load_seconds)
        self.metrics = _uvicorn(metrics_app(metrics_registry(collector)), settings,
                                settings.metrics_port, Protocol.METRICS)  # fmt: skip
        self.grpc = GrpcServer(self.dataplane, settings)
        self.signals = StopSignals()
        self._started = False  # every model load tried: load balancers may have seen it ready

    def _models_to_load(self, repository: ModelRepository) -> list[str]:
        if self.settings.model_control_mode is ModelControlMode.EXPLICIT:
            return list(self.settings.load_model)
        return repository.names()

    def request_stop(self) -> None:
        self.signals.stopping.set()

    async def run(self) -> None:
        """Listen, load the models, serve until asked to stop, then drain."""
        gc_tuning.tune()
        http_task = asyncio.create_task(self.http.serve())
        metrics_task = asyncio.create_task(self.metrics.serve())
        await self.grpc.start()
        while not (self.http.started and self.metrics.started):
            if http_task.done() or metrics_task.done():
                await asyncio.gather(http_task, metrics_task)
                return
            await asyncio.sleep(0.01)
        tls = self.settings.tls.mode if self.settings.tls is not None else TlsMode.OFF
        logger.info(
            "listening",
            extra={"host": self.settings.host, "http_port": self.http.bound_port(),
                   "grpc_port": self.grpc.port, "metrics_port": self.metrics.bound_port(),
                   "http_tls": tls, "grpc_tls": tls, "metrics_tls": TlsMode.OFF},
        )  # fmt: skip
        await self._load_models()
        await self.signals.stopping.wait()
        await self._drain(http_task, metrics_task)

    async def _load_models(self) -> None:
        """Load the start-up models in turn, until done or asked to stop."""
        names = list(self.dataplane.expected_models)
        for index, name in enumerate(names):
            if self.signals.stopping.is_set() or not await self._load_unless_stopped(name):
                logger.info("start-up stopped: models not loaded", extra={"models": names[index:]})
                return
        self._started = True
        ready = self.dataplane.ready()
        await self.grpc.set_serving(ready)
        logger.info("server ready" if ready else "server not ready: a model failed to load")

    async def _load_unless_stopped(self, name: str) -> bool:
        """Load one model; a stop signal abandons the load (False).

        Cancelling a load is safe: the instance thread finishes the batch it is running
        (a warm-up) and only then releases the runtime, so an exit waits for one batch,
        not for every model in the repository.
        """
        logger.info("loading model", extra={"model": name})
        loading = asyncio.create_task(self.registry.load(name))
        stopping = asyncio.create_task(self.signals.stopping.wait())
        await asyncio.wait((loading, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not loading.done():
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, BatchserveError):
                await loading
            logger.info("model load abandoned: shutting down", extra={"model": name})
            return False
        try:
            loading.result()
        except BatchserveError as exc:
            logger.error("model failed to load", extra={"model": name, "reason": exc.message})
        return True

    async def _shutdown_delay(self) -> None:
        """Not ready for ``--shutdown-delay`` so load balancers notice, unless they never saw
        the server ready (stopped during start-up) or a second signal hurried the stop."""
        if not self._started:
            logger.info("shutdown delay skipped: stopped during start-up")
            return
        await self.signals.delay(self.settings.shutdown_delay_seconds)

    async def _drain(self, http_task: asyncio.Task[None], metrics_task: asyncio.Task[None]) -> None:
        logger.info("shutting down: draining accepted requests")
        self.dataplane.draining = True
        await self.grpc.set_serving(False)
        await self._shutdown_delay()
        self.http.should_exit = True
        await asyncio.gather(self.grpc.stop(self.settings.shutdown_timeout_seconds), http_task)
        await self.registry.close()
        self.dataplane.shared_memory.close()  # CUDA IPC mappings before the GPUs go
        self.metrics.should_exit = True
        await metrics_task
        if self.gpus is not None:
            self.gpus.close()
        logger.info("stopped")


async def serve(settings: Settings, backend_factory: BackendFactory = create_backend) -> None:
    """Run a server until SIGTERM or SIGINT; a second signal hurries the drain."""
    server = Server(settings, backend_factory)
    server.signals.install(asyncio.get_running_loop())
    await server.run()


def _settle_heap() -> None:
    """After the loaded models change: free their cycles, freeze the rest, trim the heap."""
    gc_tuning.settle()
    malloc_tuning.trim()


def run(settings: Settings, backend_factory: BackendFactory = create_backend) -> None:
    """Blocking entry point used by the `batchserve serve` command (and bench's leaky server)."""
    malloc_tuning.limit_arenas()  # before any thread that loads a model starts
    handshake = settings.http_header_timeout_seconds
    uvloop.run(
        serve(settings, backend_factory), loop_factory=lambda: BoundedHandshakeLoop(handshake)
    )
