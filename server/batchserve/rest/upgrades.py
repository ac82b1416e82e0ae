"""Requests that offer to switch protocols, served as the HTTP/1.1 requests they also are.

``curl --http2`` on an ``http://`` URL, and Java's HTTP client by default, send ordinary
requests (POSTs with bodies included) with ``Connection: Upgrade`` and ``Upgrade: h2c``. A
server may decline the offer and answer in HTTP/1.1 (RFC 9110, section 7.8), and batchserve
switches to nothing. But httptools (llhttp) stops at the end of such a request's head, skips
its body and treats every byte after the head as the new protocol's; uvicorn then handed the
application an empty body (an inference POST got 400 "malformed JSON") and dropped, or
misread as a new request, what followed. Triton answers these requests as if the headers
were absent, and so does this protocol:

- at the end of an offering head (anything but CONNECT), a new parser takes over, fed the
  same head without its ``Upgrade`` header; it reads the body and every later request. The
  callbacks of the head read again, and of the old parser's end of message, never reach the
  rest of the protocol, so the head is counted against its limits once and one request is
  served.
- CONNECT asks for a tunnel, which the server never opens: it is answered (405, as any other
  unknown method) and the connection closed, since what follows is the tunnel's bytes.
"""

from __future__ import annotations

from typing import Any, Final

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchserve.rest.framing import request_parser

_DROPPED_HEADER: Final = b"upgrade"  # without it llhttp sees no offer


class UpgradeDecliningProtocol(HttpToolsProtocol):
    """The callbacks' side: an offering head is read again by a new parser, whose callbacks
    the protocol sees as a plain request's. Must come first in the protocol's classes, so that
    no other part sees the end of the message the old parser stopped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._old_message_ending = False  # the old parser will end the message it stopped

    def _should_upgrade(self) -> bool:
        """uvicorn's test for a WebSocket upgrade it would perform: this server performs none."""
        return False

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT":
            self._read_without_offer()
            return
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._old_message_ending:
            self._old_message_ending = False
            return
        super().on_message_complete()

    def _read_without_offer(self) -> None:
        """Hand the connection to a parser fed this head without its ``Upgrade`` header. Runs
        inside the old parser's callback; the old parser then ends the message without its
        body, and its feed stops where the body begins (see ``UpgradeResumingFeed``)."""
        version = self.parser.get_http_version().encode()
        lines = [b"%s %s HTTP/%s\r\n" % (self.parser.get_method(), self.url, version)]
        lines += [b"%s: %s\r\n" % pair for pair in self.headers if pair[0] != _DROPPED_HEADER]
        lines.append(b"\r\n")
        parser = request_parser(_HeadReadAgain(self))
        self.parser = parser
        parser.feed_data(b"".join(lines))  # a request without a body also ends here
        self._old_message_ending = True


class _HeadReadAgain:
    """The new parser's callbacks: the protocol's own, except those of the head it reads
    again, which the protocol has had already (and counted against the head's limits)."""

    def __init__(self, protocol: UpgradeDecliningProtocol) -> None:
        self._protocol = protocol
        self._again = True

    def __getattr__(self, callback: str) -> Any:
        return getattr(self._protocol, callback)  # the parser binds its callbacks once

    def on_message_begin(self) -> None:
        if not self._again:
            self._protocol.on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self._again:
            self._protocol.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._again:
            self._protocol.on_header(name, value)

    def on_headers_complete(self) -> None:
        self._again = False
        self._protocol.on_headers_complete()


class UpgradeResumingFeed(HttpToolsProtocol):
    """The feeding side (uvicorn's ``data_received``): where a parser stops at an offer, the
    rest of the read goes to the parser that took over. Must come last before uvicorn's
    protocol, so that every other part sees the reads as they came."""

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        while True:
            parser = self.parser
            try:
                parser.feed_data(data)
                return
            except httptools.HttpParserError:
                message = "Invalid HTTP request received."
                self.logger.warning(message)
                self.send_400_response(message)
                return
            except httptools.HttpParserUpgrade as stop:
                if self.parser is parser:  # CONNECT: what follows is a tunnel's
                    if self.cycle is not None:
                        self.cycle.keep_alive = False
                    return
                data = data[stop.args[0] :]
                if not data:
                    return
