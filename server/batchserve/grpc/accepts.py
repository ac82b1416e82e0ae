"""More than one gRPC call accepted at a time.

grpc.aio (1.85) keeps one request for the next call of each method outstanding with its
core, and asks again only once the call it got has reached the event loop. That takes the
loop several passes a call: the completion crosses grpc's poller thread, resolves a future,
ends a task, wakes the serving loop, which asks again in a new task. While a pass is long
(a batch run on the loop, a batch's answers) calls wait in the core unseen, and the batcher
forms its batches from the few that got through. On the 2-core machine, open-loop gRPC load
at 80 % of the measured capacity held seconds of calls in the core while batches stayed at
4; with 16 more requests outstanding, digits_cnn served 1.40x as many gRPC requests at 32
clients, at 115-136 rather than 167-184 us of server CPU each (bench/NOTES.md, seventeenth
round).

``ParallelAccepts`` keeps ``pipelines`` more requests outstanding for each method it is
given, each handing its call to grpc.aio's own call handling (the method resolver, the
server's interceptors, cancellation from the core) as grpc.aio's serving loop does. Those
are grpc.aio's private Cython entry points, so they are checked first: where a grpcio
release has changed them, the server accepts one call at a time as before and logs why.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc

logger = logging.getLogger(__name__)

ENTRY_POINTS: Mapping[str, tuple[str, ...]] = {
    "_handle_rpc": (
        "method_name",
        "method_resolver",
        "interceptors",
        "rpc_state",
        "loop",
        "concurrency_exceeded",
    ),
    "_schedule_rpc_coro": ("rpc_coro", "rpc_state", "loop", "method_name"),
}
"""grpc.aio's call handling, as its serving loop calls it (grpcio 1.85)."""

STOP_TIMEOUT_S = 5.0
"""How long ``stop`` waits for the pipelines to see the core's shutdown before it cancels."""


def cygrpc_module() -> ModuleType:
    return importlib.import_module("grpc._cython.cygrpc")


def unusable(cygrpc: ModuleType, core: object) -> str | None:
    """Why the private entry points cannot be used with ``core`` (grpc.aio's server object),
    or None when they can."""
    for name, parameters in ENTRY_POINTS.items():
        code = getattr(getattr(cygrpc, name, None), "__code__", None)
        if code is None or tuple(code.co_varnames[: code.co_argcount]) != parameters:
            return f"cygrpc.{name} does not take {', '.join(parameters)}"
    for name in ("_MethodResolver", "_RequestCallError"):
        if not hasattr(cygrpc, name):
            return f"cygrpc has no {name}"
    server_class = getattr(cygrpc, "AioServer", None)
    if server_class is None or not isinstance(core, server_class):
        return "grpc.aio's server is not a cygrpc.AioServer"
    for name in ("_request_registered_call", "is_running"):
        if not hasattr(core, name):
            return f"cygrpc.AioServer has no {name}"
    return None


class ParallelAccepts:
    """Extra outstanding call requests for a started grpc.aio server's registered methods.

    Args:
        server: the grpc.aio server; ``start`` after its own start, ``stop`` after its stop
            has begun (a request still outstanding while the server runs would take a call
            that nothing then serves).
        interceptors: the server's interceptors, applied to these calls as to the others.
        pipelines: outstanding requests per method beyond grpc.aio's one; 0 adds none.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]],
        pipelines: int,
    ) -> None:
        self._server = server
        self._interceptors = tuple(interceptors)
        self._pipelines = pipelines
        self._accepting: set[asyncio.Task[None]] = set()
        self._calls: set[asyncio.Task[Any]] = set()
        self.accepted = 0
        """Calls these pipelines took (grpc.aio's own request counts none)."""

    @property
    def running(self) -> int:
        """Pipelines waiting for a call now."""
        return sum(not task.done() for task in self._accepting)

    def start(self, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        """Pipelines for ``handlers`` (full method name to handler): methods registered
        with ``add_registered_method_handlers``."""
        if not self._pipelines or not handlers:
            return
        cygrpc = cygrpc_module()
        core = getattr(self._server, "_server", None)
        reason = unusable(cygrpc, core)
        if reason is not None:
            logger.warning("gRPC calls are accepted one at a time per method: %s", reason)
            return
        resolver = cygrpc._MethodResolver([], dict(handlers))
        for method in handlers:
            for _ in range(self._pipelines):
                accepting = asyncio.create_task(
                    self._accept(cygrpc, core, resolver, method), name=f"grpc-accept {method}"
                )
                self._accepting.add(accepting)

    async def _accept(self, cygrpc: ModuleType, core: Any, resolver: object, method: str) -> None:
        loop = asyncio.get_running_loop()
        wanted = method.encode()
        while core.is_running():
            try:
                state = await core._request_registered_call(wanted)
            except cygrpc._RequestCallError:
                return  # the core refused the request: it is shutting down
            except Exception:  # the rest of the server goes on with one pipeline fewer
                logger.exception("a gRPC accept pipeline for %s failed", method)
                return
            self.accepted += 1
            handling = cygrpc._handle_rpc(method, resolver, self._interceptors, state, loop, False)
            call = loop.create_task(cygrpc._schedule_rpc_coro(handling, state, loop, method))
            self._calls.add(call)  # the loop keeps only a weak reference to a task
            call.add_done_callback(self._calls.discard)

    async def stop(self) -> int:
        """Wait for every pipeline to see the core's shutdown; cancel any that has not, and
        return how many were (none, when the server's stop has begun)."""
        if not self._accepting:
            return 0
        _, pending = await asyncio.wait(self._accepting, timeout=STOP_TIMEOUT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        self._accepting.clear()
        return len(pending)
