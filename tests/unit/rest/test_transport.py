"""CoalescingTransport: one writelines per loop iteration, nothing lost or reordered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from batchserve.rest.transport import CoalescingTransport

pytestmark = pytest.mark.anyio


class RecordingTransport(asyncio.Transport):
    """The inner transport: records what reaches it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[bytes]] = []
        self.events: list[str] = []
        self.closing = False

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.calls.append([bytes(part) for part in list_of_data])
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closing = True
        self.events.append("close")


async def _one_iteration() -> None:
    await asyncio.sleep(0)


async def test_writes_of_one_iteration_leave_in_one_call() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(memoryview(b"body"))
    assert inner.calls == []
    assert transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\n") + 4
    await _one_iteration()
    assert inner.calls == [[b"HTTP/1.1 200 OK\r\n\r\n", b"body"]]
    transport.write(b"next")
    await _one_iteration()
    assert inner.calls[1] == [b"next"]


async def test_close_sends_what_is_held_first() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert inner.events == ["write", "close"]
    await _one_iteration()  # the scheduled flush finds nothing left to send
    assert inner.calls == [[b"last words"]]


async def test_nothing_is_written_to_a_closing_transport() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"too late")
    inner.closing = True
    await _one_iteration()
    assert inner.calls == []


async def test_a_complete_response_leaves_at_once() -> None:
    """The server's protocol sends a response as soon as its last byte is written, not one
    loop iteration later: that iteration would only add to its latency."""
    from batchserve.rest.http_limits import LimitedHttpToolsProtocol
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    inner = RecordingTransport()
    written_when_sent: list[list[list[bytes]]] = []
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})
        written_when_sent.append(list(inner.calls))
        done.set()

    config = Config(app=app, lifespan="off", log_config=None)  # leaves logging alone
    config.load()
    protocol = LimitedHttpToolsProtocol(config, ServerState(), {})
    protocol.connection_made(inner)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    await asyncio.wait_for(done.wait(), 5)
    [calls] = written_when_sent
    assert len(calls) == 1
    assert calls[0][0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert calls[0][-1] == b"ok"
    protocol.connection_lost(None)
