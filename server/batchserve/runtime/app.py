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
import os
import tempfile
from collections.abc import Awaitable

import uvloop
from uvicorn.config import STARTUP_FAILURE

from batchserve.backends.selection import create_backend
from batchserve.core.cpu_budget import available_cpus, declare_cpus
from batchserve.core.errors import BatchserveError, CannotStart, NotFound
from batchserve.core.intake import Intake
from batchserve.core.request_memory import RequestMemory
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.core.tls import TlsMode
from batchserve.dataplane.plane import DataPlane
from batchserve.devices.host import HostUsage
from batchserve.devices.host_memory import cpu_total_bytes
from batchserve.devices.nvml import GpuMonitor
from batchserve.grpc.server import GrpcServer
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import BackendFactory, ModelRegistry
from batchserve.models.repository import ModelRepository, startup_models
from batchserve.models.repository_poll import RepositoryPoller
from batchserve.observability.metrics import metrics_app
from batchserve.observability.refusals import REFUSALS, Protocol
from batchserve.rest.app import build_http_app
from batchserve.rest.forward import trusting_peer_header
from batchserve.runtime import (
    cpu_scheduling,
    gc_tuning,
    malloc_tuning,
    memmove_tuning,
    open_files,
)
from batchserve.runtime.cpus import resolve_workers
from batchserve.runtime.event_loop import BoundedHandshakeLoop
from batchserve.runtime.fork_server import ForkServer
from batchserve.runtime.http_listener import HttpListener, http_listener
from batchserve.runtime.metrics_collector import ServerCollector, metrics_registry
from batchserve.runtime.shared_ports import bound_port, ensure_unshared, reuse_port_socket
from batchserve.runtime.stop_signals import StopSignals
from batchserve.runtime.triton_metrics import TritonMetrics
from batchserve.runtime.worker_counts import WorkerCounts
from batchserve.runtime.worker_pool import Endpoints, WorkerPool
from batchserve.runtime.worker_process import serve_forked
from batchserve.scheduler.memory import MemoryBudgets
from batchserve.scheduler.rate_limiter import rate_limiter_for
from batchserve.scheduler.response_cache import local_cache

logger = logging.getLogger(__name__)

WORKER_EXIT_GRACE_S = 5.0
"""Beyond a worker's two timeouts (its HTTP clients', then its accepted requests'), for it to
close its listeners and exit."""
IN_FLIGHT = "Waiting for in-flight requests to complete."
"""Triton's line once its stop has only the accepted requests to wait for, in its words:
scripts (and Triton's ``L0_lifecycle`` tests) read the log for it."""


class Server:
    """The whole server process; ``backend_factory`` lets a test harness wrap the runtimes."""

    def __init__(
        self,
        settings: Settings,
        backend_factory: BackendFactory = create_backend,
        forks: ForkServer | None = None,
    ) -> None:
        self.settings = settings
        self._forks = forks
        try:
            repository = ModelRepository.of(settings)
        except NotFound as exc:
            raise CannotStart(exc.message) from None
        budgets = MemoryBudgets(settings.memory_budget, device_total_bytes)
        self.pool: WorkerPool | None = None
        cpus = available_cpus(settings.cpus)
        declare_cpus(settings.cpus)  # the runtimes' pools follow it too
        self.registry = ModelRegistry(
            repository, settings.max_queue_size, budgets, backend_factory,
            after_change=self._repository_changed, cpus=cpus, metrics=settings.metrics(),
            response_cache=local_cache(settings.cache_bytes()),
            rate_limiter=rate_limiter_for(settings.rate_limit, settings.rate_limit_resources()),
            wait_out_queue_delay=settings.wait_out_queue_delay,
            delay_scheduler=settings.delay_scheduler,
            backlog_delay_scheduler=settings.backlog_delay_scheduler,
        )  # fmt: skip
        for setting in settings.metrics().unknown:  # Triton ignores them too
            logger.warning("--metrics-config setting ignored", extra={"setting": setting})
        for reading in settings.metrics().read_as:
            logger.warning("--metrics-config number read in part", extra={"reading": reading})
        workers = resolve_workers(settings.workers, cpus)
        # With workers, this process reads only the requests they forward whole (for models
        # they do not know yet): it takes a share as each of them does.
        memory = RequestMemory.share(settings.max_request_memory, cpu_total_bytes(), workers)
        self.dataplane = DataPlane(
            settings, self.registry, startup_models(settings, repository), memory
        )
        self.poller = self._poller(repository)
        self._polling: asyncio.Task[None] | None = None
        self.gpus = GpuMonitor.open(settings.allow_gpu_metrics)
        self.intake = Intake()
        """Closed as the stop begins: the public listeners of a single process accept no
        request from then on (the workers' are told by this process, and stop in turn)."""
        self.http: HttpListener | None = None
        self.grpc: GrpcServer | None = None
        """The protocols' listeners: public in one process, where Triton's ``--allow-http`` or
        ``--allow-grpc`` false leaves one out; with workers, this process's Unix sockets,
        which the workers forward every call but inference to."""
        if workers == 1:
            if settings.allow_http:
                self.http = self._public_http()
            if settings.allow_grpc:
                self.grpc = GrpcServer(
                    self.dataplane, settings, reuse_port=settings.reuse_grpc_port,
                    intake=self.intake,
                )  # fmt: skip
            collector = ServerCollector(
                self.registry, self.gpus, self.registry.load_seconds,
                request_memory=lambda: (memory.held, memory.limit),
            )  # fmt: skip
        else:
            collector = self._serve_through_workers(workers)
        self.metrics = self._metrics_listener(collector) if settings.allow_metrics else None
        self.signals = StopSignals()
        self.workers_drained = True
        self._started = False  # every model load tried: load balancers may have seen it ready
        self._settle_deferred = False  # while loading at start, and once shutting down
        self._heap_unsettled = False  # the models changed while settling was deferred

    def _public_http(self) -> HttpListener:
        settings = self.settings
        listener = http_listener(build_http_app(self.dataplane, settings),
                                 settings, settings.http_port, Protocol.HTTP, settings.tls,
                                 intake=self.intake)  # fmt: skip
        if settings.reuse_http_port:  # Triton's flag: other servers may bind it too
            listener.sockets = [reuse_port_socket(
                "HTTP", settings.http_host(), settings.http_port, listening=True
            )]  # fmt: skip
        return listener

    def _poller(self, repository: ModelRepository) -> RepositoryPoller | None:
        """Triton's poll mode, unless off or polling only at the start."""
        settings = self.settings
        if settings.model_control_mode is not ModelControlMode.POLL:
            return None
        if settings.repository_poll_secs == 0:
            return None
        registry = self.registry
        return RepositoryPoller(
            repository, registry.load, registry.unload, settings.repository_poll_secs
        )

    def _metrics_listener(self, collector: ServerCollector) -> HttpListener:
        """The metrics port: batchserve's series, then Triton's (``nv_*``)."""
        fresh_counts = self.pool.fresh_counts if self.pool is not None else None
        host = HostUsage() if self.settings.allow_cpu_metrics else None
        triton = TritonMetrics(
            self.registry, self.gpus, self.registry.load_seconds, host, self.settings.metrics()
        )
        app = metrics_app(metrics_registry(collector), fresh_counts, triton.families)
        return http_listener(app, self.settings, self.settings.metrics_port, Protocol.METRICS)

    def _serve_through_workers(self, workers: int) -> ServerCollector:
        """This process keeps the models and answers its workers on Unix sockets; the
        workers share the public ports, which this process holds without listening."""
        settings = self.settings
        self._sockets = tempfile.TemporaryDirectory(prefix="batchserve-")
        http_path = os.path.join(self._sockets.name, "http.sock")
        grpc_path = os.path.join(self._sockets.name, "grpc.sock")
        app = trusting_peer_header(build_http_app(self.dataplane, settings))
        self.http = http_listener(app, settings, 0, Protocol.HTTP, uds=http_path)
        self.grpc = GrpcServer(self.dataplane, settings, internal_path=grpc_path)
        public = (("HTTP", settings.allow_http, settings.http_host(), settings.http_port,
                   settings.reuse_http_port, "--reuse-http-port"),
                  ("gRPC", settings.allow_grpc, settings.grpc_host(), settings.grpc_port,
                   settings.reuse_grpc_port, "--reuse-grpc-port"))  # fmt: skip
        ports: list[int | None] = []
        self._held = []
        for name, served, host, port, shared, flag in public:
            if not served:  # --allow-http / --allow-grpc false: the workers leave it out
                ports.append(None)
                continue
            if not shared:
                ensure_unshared(name, host, port, flag)
            held = reuse_port_socket(name, host, port, listening=False)
            self._held.append(held)
            ports.append(bound_port(held))
        counts = WorkerCounts(REFUSALS)
        endpoints = Endpoints(ports[0], ports[1], http_path, grpc_path)
        self.pool = WorkerPool(settings, self.dataplane, workers, endpoints, counts, self._forks)
        own = self.dataplane.request_memory  # a worker's share, for the requests forwarded

        def request_memory() -> tuple[int, int]:
            return own.held + counts.request_memory_held(), own.limit * workers

        return ServerCollector(self.registry, self.gpus, self.registry.load_seconds,
                               refusals=counts, grpc_core=counts.grpc_core,
                               workers=self.pool.handed_over,
                               request_memory=request_memory)  # fmt: skip

    def _repository_changed(self) -> None:
        """Workers learn of every change at once; the heap is settled after each change while
        serving, once after the start-up loads, and not at all on the way out (a settle is a
        full collection: ~80 ms on 2 cores, once per model for a repository loaded in turn)."""
        if self._settle_deferred:
            self._heap_unsettled = True
        else:
            _settle_heap()
        if self.pool is not None:
            self.pool.repository_changed()

    def request_stop(self) -> None:
        self.signals.stopping.set()

    def stop_signal_delivered(self, signals: int) -> None:
        """Run the moment a stop signal is delivered, before the event loop dispatches another
        request (``StopSignals.install``): none is accepted from then on, unless the
        ``--shutdown-delay`` is still to be served (the first signal to a server that was
        ready; a later one skips the delay)."""
        if signals > 1 or not self._started or not self.settings.shutdown_delay_seconds:
            self._close_intake()

    def _close_intake(self) -> None:
        """No public listener accepts a request from now on, this process's or a worker's."""
        self.intake.close()
        if self.pool is not None:
            self.pool.close_intakes()

    async def run(self) -> None:
        """Listen, load the models, serve until asked to stop, then drain."""
        gc_tuning.tune()
        listeners = [x for x in (self.http, self.metrics) if x is not None]
        http_task = asyncio.create_task(self.http.serve()) if self.http is not None else None
        metrics_task = None if self.metrics is None else asyncio.create_task(self.metrics.serve())
        tasks = [task for task in (http_task, metrics_task) if task is not None]
        if self.grpc is not None:
            await self.grpc.start()
        while not all(listener.started for listener in listeners):
            if any(task.done() for task in tasks):  # one could not start: none serves
                await self._abandon_start(listeners, tasks)
                return
            await asyncio.sleep(0.01)
        if self.pool is not None:
            await self.pool.start()
        self._announce()
        if self.poller is not None:
            await self.poller.start()  # the repository as the start-up loads read it
        await self._load_models()
        failed_start = self._exit_on_error()
        if self.poller is not None and not self.signals.stopping.is_set():
            self._polling = asyncio.create_task(self.poller.run(), name="repository-poll")
        await self.signals.stopping.wait()
        await self._drain(http_task, metrics_task)
        if failed_start:
            raise CannotStart(
                "failed to load all models (batchserve: --exit-on-error true stops the server "
                "when a model fails at start; false serves the others)"
            )

    def _public_ports(self) -> tuple[int | None, int | None]:
        """The HTTP and gRPC ports clients reach (None: that protocol is not served)."""
        if self.pool is not None:
            return self.pool.endpoints.http_port, self.pool.endpoints.grpc_port
        http_port = None if self.http is None else self.http.bound_port()
        return http_port, None if self.grpc is None else self.grpc.port

    def _announce(self) -> None:
        """Say where the server listens: batchserve's line, then Triton's for each service
        it started, which start-up scripts written for Triton wait for in the log."""
        settings = self.settings
        http_port, grpc_port = self._public_ports()
        tls = settings.tls.mode if settings.tls is not None else TlsMode.OFF
        grpc_tls = settings.grpc_tls
        grpc_mode = grpc_tls.mode if grpc_tls is not None else TlsMode.OFF
        metrics_port = None if self.metrics is None else self.metrics.bound_port()
        logger.info(
            "listening",
            extra={"host": settings.http_host(), "grpc_host": settings.grpc_host(),
                   "metrics_host": settings.metrics_host(),
                   "http_port": http_port, "grpc_port": grpc_port,
                   "metrics_port": metrics_port,
                   "http_tls": tls,
                   "grpc_tls": grpc_mode, "metrics_tls": TlsMode.OFF,
                   "workers": 1 if self.pool is None else self.pool.count,
                   "open_files_limit": open_files.soft_limit(),
                   "rep_movsb": "off" if memmove_tuning.rep_movsb_off() else "glibc default"},
        )  # fmt: skip
        if grpc_port is not None:
            logger.info("Started GRPCInferenceService at %s:%d", settings.grpc_host(), grpc_port)
        if http_port is not None:
            logger.info("Started HTTPService at %s:%d", settings.http_host(), http_port)
        if metrics_port is not None:
            logger.info("Started Metrics Service at %s:%d", settings.metrics_host(), metrics_port)

    async def _abandon_start(
        self, listeners: list[HttpListener], tasks: list[asyncio.Task[None]]
    ) -> None:
        """Close every listener, then raise why one could not start (CannotStart)."""
        for listener in listeners:
            listener.stop()
        if self.grpc is not None:
            await self.grpc.stop(0)
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    async def _load_models(self) -> None:
        """Load the start-up models in turn, until done or asked to stop; an ensemble loads
        its composing models itself, before their turn comes."""
        names = list(self.dataplane.expected_models)
        self._settle_deferred = True
        try:
            for index, name in enumerate(names):
                if self.registry.is_ready(name):  # loaded already, for an ensemble
                    self.registry.named(name)
                    continue
                if self.signals.stopping.is_set() or not await self._load_unless_stopped(name):
                    logger.info("start-up stopped: models not loaded",
                                extra={"models": names[index:]})  # fmt: skip
                    return
        finally:
            self._settle_deferred = False
            if self._heap_unsettled:
                self._heap_unsettled = False
                _settle_heap()
        self._started = True
        self.dataplane.startup_done = True
        ready = self.dataplane.ready()
        if self.grpc is not None:
            await self.grpc.set_serving(ready)
        logger.info("server ready" if ready else "server not ready: a model failed to load")

    def _exit_on_error(self) -> bool:
        """With Triton's ``--exit-on-error``, a failed start-up load stops the server (True):
        it was never ready, so no load balancer needs the shutdown delay."""
        if not self.settings.exit_on_error or self.dataplane.models_ready():
            return False
        if self.signals.stopping.is_set():
            return False
        self._started = False
        self.signals.stopping.set()
        return True

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

    async def _drain(
        self, http_task: asyncio.Task[None] | None, metrics_task: asyncio.Task[None] | None
    ) -> None:
        logger.info("shutting down: draining accepted requests")
        if self._polling is not None:  # no load or unload starts while draining
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError, BatchserveError):
                await self._polling
        self.dataplane.draining = True
        if self.grpc is not None:
            await self.grpc.set_serving(False)
        await self._shutdown_delay()
        self._close_intake()  # at the signal already, unless there was a delay to serve
        timeout = self.settings.shutdown_timeout_seconds
        if self.pool is not None:  # the workers drain first: this process answers for them
            logger.info(IN_FLIGHT)
            self.workers_drained = await self.pool.stop(2 * timeout + WORKER_EXIT_GRACE_S)
        elif self.http is not None:
            await self.http.wait_for_clients(asyncio.get_running_loop().time() + timeout)
            logger.info(IN_FLIGHT)
        stopping: list[Awaitable[None]] = []
        if self.http is not None and http_task is not None:
            self.http.stop()  # what it accepted has the timeout again
            stopping.append(http_task)
        if self.grpc is not None:
            stopping.append(self.grpc.stop(timeout))
        await asyncio.gather(*stopping)
        self._settle_deferred = True  # for good: the process is about to exit
        self.dataplane.tracing.close()  # every trace answered: the trace file is whole
        await self.registry.close()
        self.dataplane.shared_memory.close()  # CUDA IPC mappings before the GPUs go
        if self.metrics is not None and metrics_task is not None:
            self.metrics.stop()
            await metrics_task
        if self.gpus is not None:
            self.gpus.close()
        logger.info("stopped")


async def serve(
    settings: Settings,
    backend_factory: BackendFactory = create_backend,
    forks: ForkServer | None = None,
) -> bool:
    """Run a server until SIGTERM or SIGINT; a second signal hurries the drain. False when
    a worker had to be killed (its accepted requests may have gone unanswered)."""
    server = Server(settings, backend_factory, forks)
    server.signals.install(asyncio.get_running_loop(), server.stop_signal_delivered)
    await server.run()
    return server.workers_drained


def _settle_heap() -> None:
    """After the loaded models change: free their cycles, freeze the rest, trim the heap."""
    gc_tuning.settle()
    malloc_tuning.trim()


def run(settings: Settings, backend_factory: BackendFactory = create_backend) -> int:
    """Blocking entry point used by the `batchserve serve` command (and bench's leaky
    server); the process's exit status."""
    cpu_scheduling.apply(settings.cpu_scheduling)  # before the threads it should reach start
    open_files.raise_to_hard_limit()  # before the fork server, which the workers inherit it from
    forks = None
    if resolve_workers(settings.workers, available_cpus(settings.cpus)) > 1:
        forks = ForkServer.start(serve_forked)  # before any loop, socket or thread exists
    malloc_tuning.limit_arenas()  # before any thread that loads a model starts
    handshake = settings.http_header_timeout_seconds
    try:
        drained: bool = uvloop.run(
            serve(settings, backend_factory, forks),
            loop_factory=lambda: BoundedHandshakeLoop(handshake),
        )
    except CannotStart as exc:  # said in one line, with uvicorn's status for a failed start
        logger.error(f"the server did not start: {exc}")
        return STARTUP_FAILURE
    finally:
        if forks is not None:
            forks.close()
    return 0 if drained else 1
