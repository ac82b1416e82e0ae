"""``batchserve.Server``: the server's own registry, dataplane and batchers inside the
caller's Python process, with no listener and no socket.

A notebook, a test or another service calls models here as the HTTP and gRPC adapters call
them: every infer is an ``InferRequest`` handed to ``DataPlane.infer`` (``respond`` for a
stream), so validation, batching, statistics and errors are the network path's own.

The dataplane lives on one event loop, its *home*:

- ``async with Server(...)`` (or ``await server.start()``) makes the running loop the home;
  coroutines there call the dataplane directly.
- ``with Server(...)`` (or ``server.start_sync()``) starts a loop on a thread of its own
  (``uvloop``, as the server runs), and the ``*_sync`` methods submit to it and block. They
  never call ``asyncio.run``, so they also work from a thread that already runs a loop, as a
  Jupyter notebook's does.

Calls from any other loop or thread are submitted to the home loop, so requests from many
threads or tasks meet in the same batcher queues and share batches. Stopping drains as the
server does: readiness goes off, new requests are refused, accepted ones are answered (within
``shutdown_timeout_seconds``), then every model is unloaded.

Settings are the server's (``core.settings.Settings``: keyword arguments, or BATCHSERVE_*
variables); those of the listeners (host, ports, TLS, HTTP and gRPC limits, ``workers``)
have nothing to apply to here, and ``cpus``, where given, bounds what the measured defaults
and the runtimes' thread pools take of the host's cores. Unlike the ``serve`` command, the
host process's garbage collector and allocator are left as they are: they are the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from concurrent.futures import Future
from typing import Any, Final, Self, TypeVar, Unpack

import uvloop

from batchserve.backends.selection import create_backend
from batchserve.core.cpu_budget import available_cpus, declare_cpus
from batchserve.core.errors import BatchserveError, Unavailable, Unsupported
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, ModelMetadata, ServerMetadata
from batchserve.dataplane.control import IndexEntry
from batchserve.dataplane.plane import DataPlane
from batchserve.dataplane.statistics import ModelStatistics
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import BackendFactory, ModelRegistry
from batchserve.models.repository import ModelRepository, startup_models
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.runtime.in_process_requests import (
    InferOptions,
    Outputs,
    StreamOptions,
    infer_request,
    response_outputs,
)
from batchserve.scheduler.memory import MemoryBudgets
from batchserve.scheduler.rate_limiter import rate_limiter_for
from batchserve.scheduler.response_cache import local_cache

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Event = tuple[str, Any]  # ("response", outputs) | ("error", exception) | ("end", None)

SHUTTING_DOWN: Final = "server is shutting down"
"""What a request gets once the drain has begun (the gRPC adapter's words)."""
NOT_STARTED: Final = (
    "the server is not started: use 'async with batchserve.Server(...)', "
    "'await server.start()', 'with batchserve.Server(...)' or 'server.start_sync()'"
)
ON_HOME_THREAD: Final = (
    "a *_sync method was called on the thread running the server's event loop, which would "
    "wait for itself forever: await the async method instead, or start the server with "
    "'with batchserve.Server(...)' / 'server.start_sync()' to run it on a thread of its own"
)


class Server:
    """A batchserve server in this process: load, readiness, metadata and inference, async
    and sync, numpy in and out, through the same dataplane and batchers as HTTP and gRPC.

    ``settings`` or keyword options (``model_repository``, ``model_control_mode``,
    ``load_model``, ``memory_budget``, ``max_queue_size``, ``control_token``, ...: the
    fields of ``Settings``), not both. ``backend_factory`` lets a test wrap the runtimes.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        backend_factory: BackendFactory = create_backend,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise TypeError("give Server either settings or keyword options, not both")
        self.settings = settings if settings is not None else Settings(**options)
        repository = ModelRepository.of(self.settings)
        budgets = MemoryBudgets(self.settings.memory_budget, device_total_bytes)
        declare_cpus(self.settings.cpus)  # None: the process's own CPUs, as read
        self.registry = ModelRegistry(
            repository, self.settings.max_queue_size, budgets, backend_factory,
            cpus=available_cpus(self.settings.cpus), metrics=self.settings.metrics(),
            response_cache=local_cache(self.settings.cache_bytes()),
            rate_limiter=rate_limiter_for(
                self.settings.rate_limit, self.settings.rate_limit_resources()
            ),
            wait_out_queue_delay=self.settings.wait_out_queue_delay,
            delay_scheduler=self.settings.delay_scheduler,
            backlog_delay_scheduler=self.settings.backlog_delay_scheduler,
        )  # fmt: skip
        expected = startup_models(self.settings, repository)
        self.dataplane = DataPlane(self.settings, self.registry, expected)
        token = self.settings.control_token
        self._authorization = None if token is None else f"Bearer {token}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._home_thread: int | None = None
        self._thread: threading.Thread | None = None  # the home loop's, when it has its own
        self._accepting = False
        self._stopped = False
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._stopping: asyncio.Future[None] | None = None

    # lifecycle ----------------------------------------------------------------------
    async def start(self) -> Self:
        """Load the start-up models with the running loop as the home loop."""
        self._claim(asyncio.get_running_loop(), threading.get_ident())
        try:
            await self._start_here()
        except BaseException:
            await self._stop_here()
            raise
        return self

    def start_sync(self) -> Self:
        """Start a home loop on a thread of its own and load the start-up models there."""
        loop = uvloop.new_event_loop()
        try:
            self._claim(loop, None)
        except RuntimeError:
            loop.close()
            raise
        thread = threading.Thread(
            target=_run_forever, args=(loop,), name="batchserve-in-process", daemon=True
        )
        self._thread = thread
        thread.start()
        self._home_thread = thread.ident
        try:
            self._wait(asyncio.run_coroutine_threadsafe(self._start_here(), loop))
        except BaseException:
            self.stop_sync()
            raise
        return self

    async def stop(self) -> None:
        """Drain (new requests refused, accepted ones answered), unload every model, and end
        the home loop's thread when it has one."""
        if self._loop is None or self._loop.is_closed():
            return
        await self._on_home(self._stop_here)
        if self._thread is not None and not self._on_home_loop():
            await asyncio.to_thread(self._end_thread)

    def stop_sync(self) -> None:
        """``stop`` from plain code; not from the home loop's own thread."""
        if self._loop is None or self._loop.is_closed():
            return
        self._blocking(self._stop_here)
        self._end_thread()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def __enter__(self) -> Self:
        return self.start_sync()

    def __exit__(self, *exc_info: object) -> None:
        self.stop_sync()

    def _claim(self, loop: asyncio.AbstractEventLoop, thread: int | None) -> None:
        if self._loop is not None:
            raise RuntimeError(
                "this server was stopped: make a new one"
                if self._stopped
                else "this server is already started"
            )
        self._loop, self._home_thread = loop, thread

    async def _start_here(self) -> None:
        """The server's start-up load: each model in turn; a failure leaves the model
        UNAVAILABLE with its reason, and the server not ready, as ``serve`` does."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = True
        for name in self.dataplane.expected_models:
            logger.info("loading model", extra={"model": name})
            try:
                await self.registry.load(name)
            except BatchserveError as exc:
                logger.error("model failed to load", extra={"model": name, "reason": exc.message})
        self.dataplane.startup_done = True
        ready = self.dataplane.ready()
        logger.info("server ready" if ready else "server not ready: a model failed to load")

    async def _stop_here(self) -> None:
        """One drain, however many callers ask for it; not ready, and refusing, at once."""
        self._accepting = False
        self.dataplane.draining = True
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._drain())
        await asyncio.shield(self._stopping)

    async def _drain(self) -> None:
        logger.info("shutting down: draining accepted requests")
        if self._in_flight and self._idle is not None:
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.shutdown_timeout_seconds)
            except TimeoutError:
                logger.warning("shutdown timeout: requests still in flight",
                               extra={"in_flight": self._in_flight})  # fmt: skip
        await self.registry.close()
        self.dataplane.shared_memory.close()
        self._stopped = True
        logger.info("stopped")

    def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    @property
    def in_flight(self) -> int:
        """Requests and streams accepted and not yet answered (the drain waits for them)."""
        return self._in_flight

    # health, metadata, statistics -----------------------------------------------------
    def ready(self) -> bool:
        """Every start-up model ready and not draining (``GET /v2/health/ready``)."""
        return self._query(self.dataplane.ready)

    def model_ready(self, name: str, version: str | int = "") -> bool:
        return self._query(self.dataplane.model_ready, name, str(version))

    def server_metadata(self) -> ServerMetadata:
        return self._query(self.dataplane.server_metadata)

    def model_metadata(self, name: str, version: str | int = "") -> ModelMetadata:
        return self._query(self.dataplane.model_metadata, name, str(version))

    def model_config(self, name: str, version: str | int = "") -> ModelConfig:
        return self._query(self.dataplane.model_config, name, str(version))

    def model_statistics(self, name: str = "", version: str | int = "") -> list[ModelStatistics]:
        """Triton's statistics: every served version when ``name`` is empty."""
        return self._query(self.dataplane.model_statistics, name, str(version))

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self._query(self.dataplane.control.repository_index, self._authorization,
                           ready_only)  # fmt: skip

    # model control ------------------------------------------------------------------
    async def load(self, name: str, parameters: Mapping[str, object] | None = None) -> None:
        """Load or reload a model (model control ``explicit`` only); ``parameters`` are
        Triton's: ``config`` (JSON text) and ``file:<path>`` (bytes)."""
        await self._on_home(self._load_here, name, parameters)

    def load_sync(self, name: str, parameters: Mapping[str, object] | None = None) -> None:
        self._blocking(self._load_here, name, parameters)

    async def unload(self, name: str) -> None:
        """Finish the model's accepted requests, then release it (``explicit`` only)."""
        await self._on_home(self._unload_here, name)

    def unload_sync(self, name: str) -> None:
        self._blocking(self._unload_here, name)

    async def _load_here(self, name: str, parameters: Mapping[str, object] | None) -> None:
        await self.dataplane.control.repository_load(name, self._authorization, parameters)

    async def _unload_here(self, name: str) -> None:
        await self.dataplane.control.repository_unload(name, self._authorization)

    # inference ----------------------------------------------------------------------
    async def infer(
        self, model: str, inputs: Mapping[str, object], **options: Unpack[InferOptions]
    ) -> Outputs:
        """Run one request; its outputs by name. Errors are the dataplane's
        (``batchserve.core.errors``), worded as the network path words them."""
        request = infer_request(model, inputs, **options)
        return await self._on_home(self._infer_here, request)

    def infer_sync(
        self, model: str, inputs: Mapping[str, object], **options: Unpack[InferOptions]
    ) -> Outputs:
        """``infer`` from plain code, a thread, or a notebook cell: blocks until answered."""
        request = infer_request(model, inputs, **options)
        return self._blocking(self._infer_here, request)

    async def stream(
        self, model: str, inputs: Mapping[str, object], **options: Unpack[StreamOptions]
    ) -> AsyncIterator[Outputs]:
        """Every response to one request, as it comes: any number from a decoupled model
        (``model_transaction_policy { decoupled: true }``), one from any other."""
        request = infer_request(model, inputs, **options)
        if self._on_home_loop():
            async with contextlib.aclosing(self._respond_here(request)) as responses:
                async for response in responses:
                    yield response
            return
        caller = asyncio.get_running_loop()
        events: asyncio.Queue[_Event] = asyncio.Queue()

        def deliver(event: _Event) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                caller.call_soon_threadsafe(events.put_nowait, event)

        pump = self._submit(self._pump, request, deliver)
        try:
            while True:
                kind, value = await events.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            pump.cancel()

    def stream_sync(
        self, model: str, inputs: Mapping[str, object], **options: Unpack[StreamOptions]
    ) -> Iterator[Outputs]:
        """``stream`` from plain code: an iterator that blocks for each response."""
        request = infer_request(model, inputs, **options)
        self._check_not_home_thread()
        events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        pump = self._submit(self._pump, request, events.put)
        try:
            while True:
                kind, value = events.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            pump.cancel()

    async def _infer_here(self, request: InferRequest) -> Outputs:
        self._admit()
        try:
            served = self.dataplane.served(request.model_name, request.model_version)
            if served.config.model_transaction_policy.decoupled:
                refused = _decoupled_refusal(served.name)
                self.dataplane.record_malformed(request.model_name, request.model_version,
                                                request.protocol, refused)  # fmt: skip
                raise refused
            return response_outputs(await self.dataplane.infer(request))
        finally:
            self._release()

    async def _respond_here(self, request: InferRequest) -> AsyncGenerator[Outputs, None]:
        self._admit()
        responses = self.dataplane.respond(request, streaming=True)
        try:
            async for response in responses:
                yield response_outputs(response)
        finally:
            if isinstance(responses, AsyncGenerator):  # a reader that left ends it now
                await responses.aclose()
            self._release()

    async def _pump(self, request: InferRequest, deliver: Callable[[_Event], None]) -> None:
        """A stream read on the home loop for a caller elsewhere, one event per response."""
        try:
            async with contextlib.aclosing(self._respond_here(request)) as responses:
                async for outputs in responses:
                    deliver(("response", outputs))
        except Exception as exc:  # the caller raises it; cancellation is the caller's own
            deliver(("error", exc))
        else:
            deliver(("end", None))

    def _admit(self) -> None:
        """Count a request in flight, or refuse it once the drain has begun."""
        if not self._accepting:
            raise Unavailable(SHUTTING_DOWN)
        self._in_flight += 1
        assert self._idle is not None, "set by _start_here"
        self._idle.clear()

    def _release(self) -> None:
        self._in_flight -= 1
        if not self._in_flight and self._idle is not None:
            self._idle.set()

    # the home loop ------------------------------------------------------------------
    def _on_home_loop(self) -> bool:
        if self._loop is None:
            raise RuntimeError(NOT_STARTED)
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _on_home(self, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Await ``call`` on the home loop: directly there, submitted from elsewhere."""
        if self._on_home_loop():
            return await call(*args)
        return await asyncio.wrap_future(self._submit(call, *args))

    def _submit(self, call: Callable[..., Awaitable[_T]], *args: Any) -> Future[_T]:
        if self._loop is None:
            raise RuntimeError(NOT_STARTED)
        if self._loop.is_closed():
            raise RuntimeError("this server was stopped: make a new one")
        return asyncio.run_coroutine_threadsafe(_awaited(call, *args), self._loop)

    def _blocking(self, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run ``call`` on the home loop and wait for it, from any thread but the home one."""
        self._check_not_home_thread()
        return self._wait(self._submit(call, *args))

    @staticmethod
    def _wait(future: Future[_T]) -> _T:
        """Block for a submitted call; an interrupt (Ctrl-C in a notebook) cancels it."""
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _check_not_home_thread(self) -> None:
        if self._home_thread is not None and threading.get_ident() == self._home_thread:
            raise RuntimeError(ON_HOME_THREAD)

    def _query(self, call: Callable[..., _T], *args: Any) -> _T:
        """A read of the registry, made on the home loop's thread while another thread may
        be loading or unloading there; directly when not started or already stopped."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._home_thread == threading.get_ident():
            return call(*args)
        return self._wait(asyncio.run_coroutine_threadsafe(_called(call, *args), loop))


def _decoupled_refusal(model: str) -> Unsupported:
    """Triton's answer to a one-response call for a model that may answer any number of
    times, pointing at the in-process way to read them."""
    return Unsupported(
        "infer doesn't support models with decoupled transaction policy (batchserve: model "
        f"'{model}' may answer any number of times: iterate Server.stream)"
    )


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    """The home loop's thread: until ``stop``, then the async generators it left are closed."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())


async def _awaited(call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    return await call(*args)


async def _called(call: Callable[..., _T], *args: Any) -> _T:
    return call(*args)
