"""Request bodies reach the application intact through the server's protocol: a chunk that
arrives with nothing unread is handed over as the parser made it, chunks that arrive
behind an unread one are appended, and a body past the high-water mark pauses reading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from batchserve.rest.http_limits import LimitedHttpToolsProtocol
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.server import ServerState

from tests.unit.rest.test_transport import RecordingTransport

pytestmark = pytest.mark.anyio


class Reader:
    """An ASGI app that reads one request's body message by message, when told to."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.read_one = asyncio.Semaphore(0)
        self.done = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            await self.read_one.acquire()
            message = await receive()
            self.messages.append(message)
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})
        self.done.set()


def protocol_over(app: Any, transport: RecordingTransport) -> LimitedHttpToolsProtocol:
    """The server's HTTP protocol serving ``app``, connected over ``transport``."""
    config = Config(app=app, lifespan="off", log_config=None)
    config.load()
    protocol = LimitedHttpToolsProtocol(config, ServerState(), {})
    protocol.connection_made(transport)
    return protocol


def _serve(app: Reader) -> tuple[LimitedHttpToolsProtocol, RecordingTransport]:
    transport = RecordingTransport()
    return protocol_over(app, transport), transport


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_chunks_arriving_one_at_a_time_and_behind_unread_ones_make_the_body() -> None:
    parts = [bytes([n]) * size for n, size in enumerate((3000, 700, 900, 50), start=1)]
    body = b"".join(parts)
    app = Reader()
    protocol, _ = _serve(app)
    head = f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    protocol.data_received(head + parts[0])
    app.read_one.release()
    await _settle()
    assert [m["body"] for m in app.messages] == [parts[0]]
    assert app.messages[0]["more_body"] is True
    protocol.data_received(parts[1])  # two chunks before the app reads again
    protocol.data_received(parts[2])
    app.read_one.release()
    await _settle()
    assert app.messages[1]["body"] == parts[1] + parts[2]
    protocol.data_received(parts[3])
    app.read_one.release()
    await asyncio.wait_for(app.done.wait(), 5)
    assert app.messages[2] == {"type": "http.request", "body": parts[3], "more_body": False}
    assert b"".join(m["body"] for m in app.messages) == body
    assert all(type(m["body"]) is bytes for m in app.messages)
    protocol.connection_lost(None)


async def test_a_chunk_past_the_high_water_mark_pauses_reading_until_it_is_read() -> None:
    body = b"x" * (HIGH_WATER_LIMIT + 1)
    app = Reader()
    protocol, transport = _serve(app)
    paused: list[bool] = []
    transport.pause_reading = lambda: paused.append(True)  # type: ignore[method-assign]
    transport.resume_reading = lambda: paused.append(False)  # type: ignore[method-assign]
    head = f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    protocol.data_received(head + body)
    assert paused == [True]
    app.read_one.release()
    await asyncio.wait_for(app.done.wait(), 5)
    assert app.messages == [{"type": "http.request", "body": body, "more_body": False}]
    assert False in paused, "reading resumed once the body was read"
    protocol.connection_lost(None)
