"""Limits on the request head (request line and headers): past them, 431 and the connection
is closed.

httptools (llhttp) has no limit of its own: it buffers a header value of any size until
its line ends and hands over any number of headers, so one client could make the server
hold megabytes before any route sees the request. uvicorn's option for this
(``h11_max_incomplete_event_size``) only applies to h11, which is slower.
"""

from __future__ import annotations

from typing import Any

from batchserve.refusals import REFUSALS, Protocol, Reason
from batchserve.rest.codec import encode_error
from batchserve.rest.disconnect import DisconnectNoticeProtocol
from batchserve.rest.transport import CoalescingHttpToolsProtocol

MAX_HEAD_BYTES = 32 * 1024
"""Request line plus headers; nginx's default buffers hold 8 KiB a line."""
MAX_HEADERS = 100
"""Headers in one request, as Apache's ``LimitRequestFields``."""


class HeadTooLarge(Exception):
    """The request head passed a limit; raised inside httptools' callbacks."""


class LimitedHttpToolsProtocol(DisconnectNoticeProtocol, CoalescingHttpToolsProtocol):
    """The server's httptools protocol: one write per response, a disconnect notice per
    request, and 431 ``{"error": ...}`` for oversized heads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # counted from the parser's callbacks
        self._header_count = 0
        self._unparsed_head_bytes = 0  # bytes received while a head is incomplete
        self._in_head = True
        self._too_large: str | None = None

    # Exact counts, from what the parser hands over.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._refuse(f"request has more than {MAX_HEADERS} headers")
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._unparsed_head_bytes = False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        super().on_message_complete()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(f"request line and headers are over {MAX_HEAD_BYTES} bytes")

    def _refuse(self, message: str) -> None:
        self._too_large = message
        raise HeadTooLarge(message)

    # A line that never ends is refused by the bytes received, before httptools holds it all.
    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._unparsed_head_bytes += len(data)
        super().data_received(data)
        over = self._in_head and self._unparsed_head_bytes > MAX_HEAD_BYTES
        if over and not self.transport.is_closing():
            self._send_431(f"request line and headers are over {MAX_HEAD_BYTES} bytes")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; our callbacks' refusals become 431."""
        if self._too_large is None:
            super().send_400_response(msg)
        else:
            self._send_431(self._too_large)

    def _send_431(self, message: str) -> None:
        REFUSALS.count(Protocol.HTTP, Reason.HEAD_TOO_LARGE)
        body = encode_error(message)
        head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: application/json\r\n")
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.transport.close()
