"""A request that offers to switch protocols (``Upgrade: h2c``, ``Upgrade: websocket``) is
served as the HTTP/1.1 request it also is, body included, and the connection goes on.

httptools stops at the end of such a request's head and treats every byte after it as the
new protocol's, so uvicorn handed the application an empty body and dropped or misread what
followed. ``curl --http2`` and Java's HTTP client send these headers with ordinary POSTs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from batchserve.rest.http_limits import MAX_HEAD_BYTES, MAX_HEADERS, LimitedHttpToolsProtocol

from tests.unit.rest.test_pipelining import PausingTransport
from tests.unit.rest.test_request_body import protocol_over

pytestmark = pytest.mark.anyio

H2C = (  # what curl --http2 adds to a request on an http:// URL
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)
WEBSOCKET = (
    b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


class Echo:
    """Answers each request with its method, path and body, and counts the requests."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.seen.append((scope["method"], scope["path"], body))
        reply = f"{scope['method']} {scope['path']} {len(body)}".encode()
        headers = [(b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


def _serve() -> tuple[Echo, LimitedHttpToolsProtocol, PausingTransport]:
    app, transport = Echo(), PausingTransport()
    return app, protocol_over(app, transport), transport


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _answers(transport: PausingTransport) -> list[tuple[int, bytes]]:
    """(status, body) of each response written, in order (bodies carry content-length)."""
    data = b"".join(b"".join(call) for call in transport.calls)
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        answers.append((int(lines[0].split()[1]), rest[:length]))
        data = rest[length:]
    return answers


def _post(path: bytes, body: bytes, offer: bytes = H2C) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path,
        offer,
        len(body),
        body,
    )


async def test_posts_offering_h2c_get_their_bodies_and_the_requests_between_are_answered() -> None:
    body = b'{"inputs": []}'
    app, protocol, transport = _serve()
    protocol.data_received(
        _post(b"/a", body) + b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n" + _post(b"/c", b"xyz")
    )
    await _settle()
    assert app.seen == [("POST", "/a", body), ("GET", "/b", b""), ("POST", "/c", b"xyz")]
    assert _answers(transport) == [(200, b"POST /a 14"), (200, b"GET /b 0"), (200, b"POST /c 3")]
    assert not transport.closing


async def test_a_body_sent_after_its_head_offering_h2c_is_read_in_any_pieces() -> None:
    body = bytes(range(256)) * 300  # 76.8 KB: past the high-water mark and the parser's pieces
    app, protocol, transport = _serve()
    whole = _post(b"/a", body)
    head_end = whole.index(b"\r\n\r\n") + 4
    protocol.data_received(whole[:head_end])  # the head alone, as Ktor and curl write it
    await _settle()
    for start in range(head_end, len(whole), 7000):
        protocol.data_received(whole[start : start + 7000])
        await _settle()
    protocol.data_received(_post(b"/c", b"xy"))
    await _settle()
    assert app.seen == [("POST", "/a", body), ("POST", "/c", b"xy")]
    assert [status for status, _ in _answers(transport)] == [200, 200]


async def test_a_chunked_body_offering_h2c_is_read_as_java_sends_it() -> None:
    app, protocol, transport = _serve()
    head = b"POST /a HTTP/1.1\r\nHost: t\r\n" + H2C + b"Transfer-Encoding: chunked\r\n\r\n"
    protocol.data_received(head)
    protocol.data_received(b"3\r\nabc\r\n")
    protocol.data_received(b"4\r\ndefg\r\n0\r\n\r\n")
    await _settle()
    assert app.seen == [("POST", "/a", b"abcdefg")]
    assert _answers(transport) == [(200, b"POST /a 7")]


async def test_a_websocket_handshake_is_answered_as_the_get_it_is() -> None:
    app, protocol, transport = _serve()
    offer = b"GET /v HTTP/1.1\r\nHost: t\r\n" + WEBSOCKET + b"\r\n"
    protocol.data_received(offer + b"GET /w HTTP/1.1\r\nHost: t\r\n\r\n")
    await _settle()
    assert app.seen == [("GET", "/v", b""), ("GET", "/w", b"")]
    assert _answers(transport) == [(200, b"GET /v 0"), (200, b"GET /w 0")]


async def test_an_offer_that_also_asks_to_close_is_answered_then_closed() -> None:
    _, protocol, transport = _serve()
    offer = b"Connection: Upgrade, close\r\nUpgrade: h2c\r\n"
    protocol.data_received(_post(b"/a", b"abc", offer))
    await _settle()
    assert _answers(transport) == [(200, b"POST /a 3")]
    assert transport.closing


async def test_an_offer_at_the_head_limits_is_served_and_past_them_refused() -> None:
    """The head is counted once, though it is read again without the offer."""
    lines = H2C.count(b"\r\n") + 2  # Host and Content-Length
    padding = b"".join(b"X-%d: v\r\n" % n for n in range(MAX_HEADERS - lines))
    app, protocol, transport = _serve()
    protocol.data_received(_post(b"/a", b"abc", H2C + padding))
    await _settle()
    assert _answers(transport) == [(200, b"POST /a 3")]
    protocol.data_received(_post(b"/b", b"abc", H2C + padding + b"X-last: v\r\n"))
    await _settle()
    assert _answers(transport)[1][0] == 431
    assert transport.closing
    assert len(app.seen) == 1
    long_value = b"X-long: " + b"v" * (MAX_HEAD_BYTES - 300) + b"\r\n"
    app, protocol, transport = _serve()
    protocol.data_received(_post(b"/a", b"abc", H2C + long_value))
    await _settle()
    assert _answers(transport) == [(200, b"POST /a 3")]
