"""The server's HTTP protocol, and its limits on the request head (request line and
headers): past them, 431 and the connection is closed.

httptools (llhttp) has no limit of its own: it buffers a header value of any size until
its line ends, joining its pieces with ``bytes +=`` (a cost that grows with the square of
its size), and hands over any number of headers, so one client could make the server hold
megabytes, and its event loop for seconds, before any route sees the request. A chunked
body's trailers are header lines too, after the body: the same limits apply to them.
uvicorn's option for this (``h11_max_incomplete_event_size``) only applies to h11, which is
slower. A chunked body may have at most Triton's 65,536 non-empty chunks (400 past them, in
Triton's words), since every chunk costs the parser's callbacks whatever its size.

A request httptools cannot parse at all (bad request line, header characters or chunked
framing) is a 400 in the protocol's JSON error shape rather than uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from batchserve.core.intake import Intake
from batchserve.observability.refusals import Protocol, Reason
from batchserve.rest.disconnect import DisconnectNoticeProtocol
from batchserve.rest.framing import DoubleFramingProtocol
from batchserve.rest.http_timeouts import ReadTimeoutProtocol, ReadTimeouts, SendTimeoutProtocol
from batchserve.rest.pipelining import PipelineLimitProtocol
from batchserve.rest.request_body import UncopiedBodyProtocol
from batchserve.rest.transport import CoalescingHttpToolsProtocol
from batchserve.rest.upgrades import UpgradeDecliningProtocol, UpgradeResumingFeed

MAX_HEAD_BYTES = 32 * 1024
"""Request line plus headers; nginx's default buffers hold 8 KiB a line."""
MAX_HEADERS = 100
"""Headers in one request, as Apache's ``LimitRequestFields``."""


MAX_CHUNKS = 65536
"""Non-empty chunks in one chunked body, Triton's limit: each costs the parser's callbacks
(about 2.6 µs on the 2-core reference machine), so a 4 MiB body sent a byte a chunk held the
server's event loop for 10.9 s."""
TOO_MANY_CHUNKS = (
    f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. Send fewer or "
    "larger HTTP chunks."
)


class OverLimit(Exception):
    """The request's head or its chunked framing passed a limit; raised inside httptools'
    callbacks, it stops the parser."""


MALFORMED = "malformed HTTP request: its request line, headers or body framing do not parse"


class HeadLimitProtocol(
    ReadTimeoutProtocol, SendTimeoutProtocol, DisconnectNoticeProtocol,
    CoalescingHttpToolsProtocol, UncopiedBodyProtocol, UpgradeResumingFeed,
):  # fmt: skip
    """One write per response, a disconnect notice per request, read and send timeouts, request
    bodies without uvicorn's copies, 431 ``{"error": ...}`` for oversized heads and 400 for
    unparseable requests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # counted from the parser's callbacks
        self._header_count = 0
        self._unparsed_head_bytes = 0  # bytes received while a head is incomplete
        self._in_head = True
        self._trailing = False  # after a chunk's size line, before any of its data
        self._chunks = 0  # size lines of the body being read
        self._over: tuple[Reason, int, str] | None = None  # the refusal a callback raised

    # Exact counts, from what the parser hands over.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._header_count = self._chunks = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._refuse(Reason.HEAD_TOO_LARGE, 431, f"request has more than {MAX_HEADERS} headers")
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._unparsed_head_bytes = False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._trailing = True, False
        super().on_message_complete()

    # A chunk's data follows its size line at once, so bytes read after a size line with no
    # data since are the trailers that follow the last chunk (size 0).
    def on_chunk_header(self) -> None:
        self._trailing, self._unparsed_head_bytes = True, 0
        self._chunks += 1
        if self._chunks > MAX_CHUNKS + 1:  # every chunk before this one had data
            self._refuse(Reason.BODY_TOO_LARGE, 400, TOO_MANY_CHUNKS)  # Triton's answer

    def on_chunk_complete(self) -> None:
        self._trailing = False

    def on_body(self, body: bytes) -> None:
        self._trailing = False
        super().on_body(body)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(
                Reason.HEAD_TOO_LARGE,
                431,
                f"request line and headers are over {MAX_HEAD_BYTES} bytes",
            )

    def _refuse(self, reason: Reason, status: int, message: str) -> None:
        """Stop the parser; ``send_400_response`` then answers ``status`` and closes."""
        self._over = (reason, status, message)
        raise OverLimit(message)

    # A line that never ends is refused by the bytes received, before httptools holds it all.
    # A read is counted when it begins in the head or the trailers; the pipelining bound hands
    # over 4 KiB at most at a time of bytes not known to be body, so few go uncounted.
    def data_received(self, data: bytes) -> None:
        if self._in_head or self._trailing:
            self._unparsed_head_bytes += len(data)
        super().data_received(data)
        unparsed = self._in_head or self._trailing
        over = unparsed and self._unparsed_head_bytes > MAX_HEAD_BYTES
        if over and not self.transport.is_closing():
            part = "request line and headers" if self._in_head else "chunked body's trailers"
            self.refuse(Reason.HEAD_TOO_LARGE, 431, f"{part} are over {MAX_HEAD_BYTES} bytes")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error: our callbacks' refusals as they said, the
        parser's own 400 in JSON (none for a request answered before its body went bad)."""
        if self._over is not None:
            self.refuse(*self._over)
            return
        answered = not self._in_head and self.cycle is not None and self.cycle.response_started
        self.refuse(Reason.MALFORMED, None if answered else 400, MALFORMED)


class LimitedHttpToolsProtocol(
    UpgradeDecliningProtocol, DoubleFramingProtocol, PipelineLimitProtocol, HeadLimitProtocol
):
    """The server's httptools protocol: the head limits above, counted on the bytes the
    parser is given, which the pipelining bound hands over only as requests make room;
    requests offering another protocol served as HTTP/1.1; a chunked body that also declares
    a length read by its chunks; no new connection once the server's intake has closed, and
    each older one closed after its next answer."""

    intake: ClassVar[Intake | None] = None
    """The server's, for its public listener (each listener sets its own)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A connection made once the stop has begun is closed unanswered, as Triton resets
        it: whatever it sends is not accepted (the listener itself closes a little later)."""
        super().connection_made(transport)
        intake = self.intake
        if intake is not None and not intake.open:
            self.refuse(Reason.UNAVAILABLE, None, "")

    def on_headers_complete(self) -> None:
        """A request read once the stop has begun, on a connection made before, is served,
        and its answer closes the connection (``close_after_answer``)."""
        super().on_headers_complete()
        intake = self.intake
        if intake is not None and not intake.open:
            self.close_after_answer()

    def close_after_answer(self) -> None:
        """The request being served has its answer say ``Connection: close``, and the
        connection closes after it; an idle connection stays open. Triton keeps serving a
        connection made before its stop while its HTTP service waits, up to the exit
        timeout, for clients to close theirs (L0_lifecycle's
        ``test_shutdown_with_live_connection``: an idle connection's next request answered
        two seconds after SIGINT); the close tells the client to take its next request
        elsewhere, so a pooled connection does not hold the stop until the timeout. Called
        for each request read after the stop began, and for the one being served as the
        stop's wait for clients begins (``HttpListener.wait_for_clients``)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False


def protocol_for(
    listener: Protocol,
    timeouts: ReadTimeouts,
    intake: Intake | None = None,
    send_seconds: float = SendTimeoutProtocol.send_seconds,
) -> type[LimitedHttpToolsProtocol]:
    """The protocol class of one listener. uvicorn instantiates the class it is given with
    fixed arguments, so the listener's own settings travel as class attributes."""

    class ListenerProtocol(LimitedHttpToolsProtocol):
        pass

    ListenerProtocol.listener = listener
    ListenerProtocol.read_timeouts = timeouts
    ListenerProtocol.send_seconds = send_seconds
    ListenerProtocol.intake = intake
    ListenerProtocol.__name__ = ListenerProtocol.__qualname__ = f"{listener.name.title()}Protocol"
    return ListenerProtocol
