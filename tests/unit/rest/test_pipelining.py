"""A client that pipelines requests gets every answer in order, while the server parses no
more than ``MAX_QUEUED`` of them ahead of the one it answers and reads nothing more."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from batchserve.rest.http_limits import LimitedHttpToolsProtocol
from batchserve.rest.pipelining import MAX_QUEUED

from tests.unit.rest.test_request_body import protocol_over
from tests.unit.rest.test_transport import RecordingTransport

pytestmark = pytest.mark.anyio


class GatedEcho:
    """An ASGI app that answers each request with its path and body, one request per release."""

    def __init__(self) -> None:
        self.gate = asyncio.Semaphore(0)
        self.answered = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await self.gate.acquire()
        reply = scope["path"].encode() + b":" + body
        headers = [(b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})
        self.answered += 1


class PausingTransport(RecordingTransport):
    """Records whether reading is paused, as uvloop's transport would apply it."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def written(self) -> bytes:
        return b"".join(b"".join(call) for call in self.calls)


def _serve(app: GatedEcho) -> tuple[LimitedHttpToolsProtocol, PausingTransport]:
    transport = PausingTransport()
    return protocol_over(app, transport), transport


def _get(n: int) -> bytes:
    return f"GET /r{n} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


PIECE_REQUESTS = 4096 // len(_get(0))
"""The most requests one piece handed to the parser can hold."""


def _post(n: int, body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        halves = (body[: len(body) // 2], body[len(body) // 2 :])
        framed = b"".join(b"%x\r\n%s\r\n" % (len(h), h) for h in halves) + b"0\r\n\r\n"
        return (
            f"POST /r{n} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + framed
        )
    head = f"POST /r{n} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _replies(transport: PausingTransport) -> list[bytes]:
    """The bodies of the responses written, in order."""
    replies, rest = [], transport.written()
    while rest:
        head, _, rest = rest.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        replies.append(rest[:length])
        rest = rest[length:]
    return replies


async def _answer_all(app: GatedEcho, count: int) -> None:
    for _ in range(count):
        app.gate.release()
    for _ in range(100 * count):
        if app.answered == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{app.answered} of {count} answered")


async def test_a_burst_of_pipelined_requests_is_parsed_only_as_far_as_the_bound() -> None:
    app = GatedEcho()
    protocol, transport = _serve(app)
    protocol.data_received(b"".join(_get(n) for n in range(200)))
    await asyncio.sleep(0)
    assert len(protocol.pipeline) == MAX_QUEUED  # uvicorn alone parsed all 199 behind the first
    assert not transport.reading
    protocol.flow.resume_reading()  # as uvicorn asks when a body is read: still held
    assert not transport.reading
    await _answer_all(app, 200)
    assert _replies(transport) == [b"/r%d:" % n for n in range(200)]
    assert transport.reading, "reading resumes once the held requests are parsed"
    assert not protocol.pipeline
    protocol.connection_lost(None)


async def test_bodies_behind_the_bound_arrive_whole_and_in_order() -> None:
    app = GatedEcho()
    protocol, transport = _serve(app)
    count = 300
    bodies = {n: bytes([65 + n % 26]) * (n * 997 % 5000) for n in range(count)}
    stream = b"".join(
        _post(n, bodies[n], chunked=n % 3 == 1) if n % 2 else _get(n) for n in range(count)
    )
    for start in range(0, len(stream), 65536):  # reads as a transport would make them
        protocol.data_received(stream[start : start + 65536])
        assert len(protocol.pipeline) <= MAX_QUEUED + PIECE_REQUESTS
    await _answer_all(app, count)
    expected = [b"/r%d:" % n + (bodies[n] if n % 2 else b"") for n in range(count)]
    assert _replies(transport) == expected
    protocol.connection_lost(None)


async def test_a_request_that_fits_the_bound_is_parsed_at_once() -> None:
    app = GatedEcho()
    protocol, transport = _serve(app)
    body = b"z" * 300_000
    protocol.data_received(_get(0) + _post(1, body)[:100_000])
    await asyncio.sleep(0)
    assert len(protocol.pipeline) == 1  # the POST waits behind the GET, its body arriving
    protocol.data_received(_post(1, body)[100_000:])
    await _answer_all(app, 2)
    assert _replies(transport) == [b"/r0:", b"/r1:" + body]
    protocol.connection_lost(None)
