"""A bound on the HTTP/1.1 requests one connection may queue behind the one being answered.

uvicorn's httptools protocol parses every byte it reads: a client that pipelines requests
and never reads its responses has each of them parsed into a request cycle that waits its
turn, and every response that completes lets one more read in. Measured on this server with
20 such connections, 265 MB of pipelined inference requests held 1.1 GB in the process and
none of it was freed. Here, as in Go's and Node's HTTP servers, a connection's later requests
stay unparsed bytes once ``MAX_QUEUED`` wait: the bytes already read are kept as they came,
no more are read, and each completed response lets the next ones be parsed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchserve.rest.http_timeouts import PauseTimingFlowControl

MAX_QUEUED = 8
"""Requests a connection may have parsed and waiting behind the one being answered."""
PIECE_BYTES = 4096
"""Most bytes handed to the parser at once that are not known to be a request body: each
request takes at least 18 of them, so one piece makes at most a few hundred requests."""
_HEAD_END = b"\r\n\r\n"


class HoldingFlowControl(PauseTimingFlowControl):
    """Flow control that stays paused while its connection holds unparsed requests, however
    often uvicorn asks to resume (once per response, and whenever a body is read)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        holding: Callable[[], bool],
    ) -> None:
        super().__init__(transport, loop)
        self._holding = holding

    def resume_reading(self) -> None:
        if self.read_paused and self._holding():
            return
        super().resume_reading()


class PipelineLimitProtocol(HttpToolsProtocol):
    """Hands the parser a connection's bytes only while fewer than ``MAX_QUEUED`` requests
    wait; the rest are held, unparsed, until responses make room."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = b""
        self._body_left = 0  # bytes of the current request's body still to parse

    def flow_control(self) -> PauseTimingFlowControl:
        return HoldingFlowControl(self.transport, self.loop, self._holding)

    def _holding(self) -> bool:
        return bool(self._held) or len(self.pipeline) >= MAX_QUEUED

    def data_received(self, data: bytes) -> None:
        if self._holding():
            self._held += data
            self.flow.pause_reading()
            return
        if len(data) <= self._body_left + PIECE_BYTES:  # one request, or the body being read
            super().data_received(data)
            return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        """Parse ``data`` a piece at a time: a head alone (so that its body reaches the
        application in one piece), then exactly its body; stop where ``MAX_QUEUED`` wait."""
        view, start, end = memoryview(data), 0, len(data)
        while start < end and len(self.pipeline) < MAX_QUEUED and not self.transport.is_closing():
            if self._body_left > 0:
                stop = start + self._body_left
            else:
                head_end = data.find(_HEAD_END, start, start + PIECE_BYTES)
                stop = head_end + len(_HEAD_END) if head_end >= 0 else start + PIECE_BYTES
            stop = min(stop, end)
            super().data_received(view[start:stop])  # type: ignore[arg-type]  # any buffer
            start = stop
        self._held = data[start:] if start < end and not self.transport.is_closing() else b""
        if self._held:
            self.flow.pause_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next queued request, if any
        if self._held and not self.transport.is_closing():
            self._parse(self._held)
            if not self._holding():
                self.flow.resume_reading()

    def on_headers_complete(self) -> None:
        self._body_left = _content_length(self.headers)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_left -= len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_left = 0
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._held = b""
        super().connection_lost(exc)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's declared body length; 0 when absent or not a number (the parser refuses
    those), or for a chunked body, which is then parsed a piece at a time."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0
