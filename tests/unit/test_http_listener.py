"""The HTTP listener's own loop and stop (``runtime/http_listener.py``), which replace
uvicorn's: a real listener on loopback, a real client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from batchserve.core.settings import Settings
from batchserve.observability.refusals import Protocol
from batchserve.runtime.http_listener import HttpListener, http_listener

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

pytestmark = pytest.mark.anyio


class HeldApp:
    """Answers ``/held`` once ``release`` is set, everything else at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.cancelled = False

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["path"] == "/held":
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _serving(
    app: HeldApp, shutdown_timeout: float
) -> tuple[HttpListener, asyncio.Task[None]]:
    settings = Settings(shutdown_timeout_seconds=shutdown_timeout)
    listener = http_listener(app, settings, 0, Protocol.HTTP)
    task = asyncio.create_task(listener.serve())
    while not listener.started:
        await asyncio.sleep(0.01)
    return listener, task


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as opened:
        yield opened


async def test_the_date_header_is_refreshed_each_second(client: httpx.AsyncClient) -> None:
    listener, task = await _serving(HeldApp(), 5)
    url = f"http://127.0.0.1:{listener.bound_port()}/"
    first = (await client.get(url)).headers["date"]
    await asyncio.sleep(1.2)  # the Date header has a resolution of one second
    assert (await client.get(url)).headers["date"] != first
    listener.stop()
    await task


async def _stopped_holding(
    client: httpx.AsyncClient, app: HeldApp, shutdown_timeout: float
) -> tuple[asyncio.Task[None], asyncio.Task[httpx.Response]]:
    """A listener stopped while ``app`` holds a request: its serving task and the request."""
    listener, task = await _serving(app, shutdown_timeout)
    held = asyncio.create_task(client.get(f"http://127.0.0.1:{listener.bound_port()}/held"))
    await app.entered.wait()
    listener.stop()
    return task, held


async def test_a_stop_answers_the_request_in_flight_then_ends(client: httpx.AsyncClient) -> None:
    app = HeldApp()
    task, held = await _stopped_holding(client, app, 5)
    await asyncio.sleep(0.05)
    assert not task.done(), "the stop ended before the request it accepted was answered"
    app.release.set()
    assert (await held).text == "ok"
    await asyncio.wait_for(task, 5)
    assert not app.cancelled


async def test_a_request_past_the_graceful_timeout_is_cancelled(client: httpx.AsyncClient) -> None:
    app = HeldApp()
    task, held = await _stopped_holding(client, app, 1)
    await asyncio.wait_for(task, 5)
    assert app.cancelled
    assert (await held).status_code == 500  # uvicorn's answer to an application that failed
