"""A request body framed twice, chunked and with a Content-Length, is read by its chunks with
the length dropped, and its connection closes after the answer (RFC 9112, section 6.1), as
Triton reads it; a body whose last transfer coding is not chunked is refused.

llhttp refused the first kind, which Python's ``requests`` sends whenever a caller sets
``Transfer-Encoding: chunked`` on a body of bytes (Triton's L0_http does); the leniency that
reads it would have read the second kind until the connection closed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.rest.test_pipelining import PausingTransport
from tests.unit.rest.test_request_body import protocol_over
from tests.unit.rest.test_upgrades import H2C, Echo, _answers, _settle

pytestmark = pytest.mark.anyio

CHUNKED_ABCDEFG = b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
NEXT = b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n"


class HeaderEcho(Echo):
    """The upgrade tests' echo, keeping the headers each request came with as well."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[list[tuple[bytes, bytes]]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.headers.append(list(scope["headers"]))
        await super().__call__(scope, receive, send)


async def _send(data: bytes) -> tuple[HeaderEcho, PausingTransport]:
    app, transport = HeaderEcho(), PausingTransport()
    protocol_over(app, transport).data_received(data)
    await _settle()
    return app, transport


def _head(*headers: bytes) -> bytes:
    return b"POST /a HTTP/1.1\r\nHost: t\r\n" + b"".join(headers) + b"\r\n"


@pytest.mark.parametrize(
    "framing",
    [
        (b"Transfer-Encoding: chunked\r\n", b"Content-Length: 4\r\n"),
        (b"Content-Length: 4\r\n", b"Transfer-Encoding: chunked\r\n"),
        (b"Content-Length: 25\r\n", b"Transfer-Encoding: gzip, chunked\r\n"),
    ],
    ids=["chunked-then-length", "length-then-chunked", "codings-ending-chunked"],
)
async def test_a_body_framed_twice_is_read_by_its_chunks_and_the_connection_closed(
    framing: tuple[bytes, bytes],
) -> None:
    """The Content-Length (4) would have ended the body inside its first chunk and left the
    rest to be read as the next request: the chunks win, and nothing after them is read."""
    app, transport = await _send(_head(*framing) + CHUNKED_ABCDEFG + NEXT)
    assert app.seen == [("POST", "/a", b"abcdefg")]
    names = [name for name, _ in app.headers[0]]
    assert b"content-length" not in names
    assert b"transfer-encoding" in names
    assert _answers(transport) == [(200, b"POST /a 7")]
    assert b"connection: close" in transport.written().lower()
    assert transport.closing


async def test_a_chunked_body_without_a_length_keeps_its_connection() -> None:
    app, transport = await _send(_head(b"Transfer-Encoding: chunked\r\n") + CHUNKED_ABCDEFG + NEXT)
    assert app.seen == [("POST", "/a", b"abcdefg"), ("GET", "/next", b"")]
    assert _answers(transport) == [(200, b"POST /a 7"), (200, b"GET /next 0")]
    assert not transport.closing


@pytest.mark.parametrize(
    "framing",
    [
        (b"Transfer-Encoding: gzip\r\n",),
        (b"Transfer-Encoding: gzip\r\n", b"Content-Length: 7\r\n"),
        (b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: gzip\r\n"),
        (H2C, b"Transfer-Encoding: gzip\r\n", b"Content-Length: 7\r\n"),
    ],
    ids=["gzip", "gzip-with-length", "chunked-then-gzip", "gzip-offering-h2c"],
)
async def test_a_body_whose_last_coding_is_not_chunked_is_refused(
    framing: tuple[bytes, ...],
) -> None:
    """Its end cannot be known: llhttp's leniency would read it until the client closed."""
    app, transport = await _send(_head(*framing) + b"abcdefg")
    assert app.seen == []
    assert [status for status, _ in _answers(transport)] == [400]
    assert transport.closing


async def test_a_body_framed_twice_offering_h2c_is_read_by_its_chunks() -> None:
    """The parser that reads an offering request again has the same leniency."""
    framing = (H2C, b"Transfer-Encoding: chunked\r\n", b"Content-Length: 4\r\n")
    app, transport = await _send(_head(*framing) + CHUNKED_ABCDEFG + NEXT)
    assert app.seen == [("POST", "/a", b"abcdefg")]
    assert _answers(transport) == [(200, b"POST /a 7")]
    assert transport.closing
