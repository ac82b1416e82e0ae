"""Extra accept pipelines on a real grpc.aio server: calls that queued in grpc's core while
the event loop was busy all reach it in the next passes, through the server's interceptors,
and the pipelines end with the server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from batchserve.grpc.accepts import ParallelAccepts, cygrpc_module, unusable

pytestmark = pytest.mark.anyio

SERVICE = "test.Echo"
METHOD = f"/{SERVICE}/Say"
HELD_CALLS = 24
HOLD_S = 0.3


@dataclass
class Passes:
    """Counts the event loop's passes, and the pass each call started in."""

    count: int = 0
    started: list[int] = field(default_factory=list)

    def tick(self) -> None:
        self.count += 1
        asyncio.get_running_loop().call_soon(self.tick)


class Counting(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.calls = 0

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        self.calls += 1
        return await continuation(details)


@asynccontextmanager
async def echo_server(
    pipelines: int,
) -> AsyncIterator[tuple[int, Passes, Counting, ParallelAccepts]]:
    passes, counting = Passes(), Counting()

    async def say(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        passes.started.append(passes.count)
        return request

    handlers = {"Say": grpc.unary_unary_rpc_method_handler(say)}
    server = grpc.aio.server(interceptors=[counting])
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    accepts = ParallelAccepts(server, [counting], pipelines)
    accepts.start({METHOD: handlers["Say"]})
    asyncio.get_running_loop().call_soon(passes.tick)
    try:
        yield port, passes, counting, accepts
    finally:
        await server.stop(0)
        assert await accepts.stop() == 0  # each pipeline saw the core's shutdown itself


def _call_all(
    port: int, calls: int, connected: threading.Event, go: threading.Event, sent: threading.Event
) -> list[bytes]:
    """``calls`` concurrent calls from one channel, as a load generator sends them, once
    connected and told to go; ``sent`` is set once every call has been started."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        say = channel.unary_unary(METHOD, _registered_method=True)
        grpc.channel_ready_future(channel).result(timeout=10)
        connected.set()
        go.wait(10)
        futures = [say.future(str(k).encode(), timeout=30) for k in range(calls)]
        sent.set()
        return [future.result() for future in futures]


async def _held_then_released(pipelines: int) -> tuple[list[int], list[bytes], Counting, int]:
    """Calls sent while the loop is held (a long pass: a batch run on it); the passes they
    started in once it was released."""
    async with echo_server(pipelines) as (port, passes, counting, accepts):
        loop = asyncio.get_running_loop()
        connected, go, sent = threading.Event(), threading.Event(), threading.Event()
        with ThreadPoolExecutor(1) as pool:
            answers = loop.run_in_executor(pool, _call_all, port, HELD_CALLS, connected, go, sent)
            await loop.run_in_executor(None, connected.wait, 10)
            await asyncio.sleep(0.05)  # the pipelines' requests are all outstanding
            go.set()
            # the loop is held (a long pass) until the client has started every call and
            # for HOLD_S after, so the calls wait in grpc's core, not in a client that a
            # busy machine was slow to schedule (then they arrived after the release)
            sent.wait(10)
            time.sleep(HOLD_S)
            released = passes.count
            replies = await answers
        started = [at - released for at in passes.started]
        return started, replies, counting, accepts.accepted


async def test_calls_held_back_by_a_busy_loop_start_together_once_it_is_free() -> None:
    started, replies, counting, accepted = await _held_then_released(pipelines=HELD_CALLS)
    assert sorted(replies) == sorted(str(k).encode() for k in range(HELD_CALLS))
    assert counting.calls == HELD_CALLS  # the server's interceptor saw every call
    assert accepted >= HELD_CALLS - 1  # grpc.aio's own request takes at most one
    # together: each call starts in the pass after grpc core has read it, so the calls
    # start in a few passes at most (one, or the waves in which a machine busy with other
    # work let the core read them, 5 and 1,911 passes after the release in one such run;
    # the one grpc.aio's own request took may start alone), not one every few passes
    assert len(set(started)) <= 4, started


async def test_without_pipelines_grpc_aio_takes_one_call_every_few_passes() -> None:
    """What the pipelines are for: grpc.aio alone starts the same calls one by one, each a
    few event-loop passes after the one before."""
    started, replies, _, accepted = await _held_then_released(pipelines=0)
    assert len(replies) == HELD_CALLS
    assert accepted == 0
    assert max(started) >= HELD_CALLS, started
    assert len(set(started)) > 4, started  # the other test's bound, not met without them


async def test_the_pipelines_end_with_the_server() -> None:
    async with echo_server(pipelines=4) as (_, _, _, accepts):
        assert accepts.running == 4
        server_task_names = {t.get_name() for t in asyncio.all_tasks()}
        assert f"grpc-accept {METHOD}" in server_task_names
    assert accepts.running == 0
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("grpc-accept")]


async def test_the_pinned_grpcio_has_the_entry_points() -> None:
    """A grpcio release that changes them turns the pipelines off (logged); this fails then,
    so that the change is seen here first."""
    async with echo_server(pipelines=1) as (_, _, _, accepts):
        assert accepts.running == 1


def test_changed_entry_points_are_named_and_the_pipelines_stand_aside() -> None:
    real = cygrpc_module()
    changed = SimpleNamespace(**{name: getattr(real, name) for name in dir(real)})
    changed._handle_rpc = lambda method_name, rpc_state, loop: None
    assert unusable(changed, object()) == (
        "cygrpc._handle_rpc does not take method_name, method_resolver, interceptors, "
        "rpc_state, loop, concurrency_exceeded"
    )
    assert unusable(real, object()) == "grpc.aio's server is not a cygrpc.AioServer"


async def test_no_pipelines_adds_no_task() -> None:
    async with echo_server(pipelines=0) as (_, _, _, accepts):
        assert accepts.running == 0


async def test_a_pipeline_that_fails_is_logged_and_the_server_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Pipelines for a method grpc core does not know (never registered) fail at once."""
    server = grpc.aio.server()
    server.add_registered_method_handlers(  # type: ignore[attr-defined]
        SERVICE, {"Say": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        unknown = {f"/{SERVICE}/Unregistered": grpc.unary_unary_rpc_method_handler(_echo)}
        broken = ParallelAccepts(server, [], 2)
        with caplog.at_level(logging.ERROR, logger="batchserve.grpc.accepts"):
            broken.start(unknown)
            for _ in range(10):
                await asyncio.sleep(0)
        assert broken.running == 0
        message = f"a gRPC accept pipeline for /{SERVICE}/Unregistered failed"
        assert [r.getMessage() for r in caplog.records] == [message] * 2
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await channel.unary_unary(METHOD)(b"still") == b"still"
    finally:
        await server.stop(0)


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request
