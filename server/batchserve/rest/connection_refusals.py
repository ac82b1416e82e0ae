"""Refusals the HTTP connection makes itself, before or instead of the application: counted,
answered with ``{"error": ...}`` and ``connection: close``, then the connection is closed.

uvicorn answers an unparseable request with a text/plain 400 and a timed-out one with
nothing; clients of the protocol expect the JSON error body from every status.
"""

from __future__ import annotations

from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from batchserve.observability.refusals import REFUSALS, Protocol, Reason
from batchserve.rest.codec import encode_error


class RefusingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with one way to turn a request or connection away."""

    listener: ClassVar[Protocol] = Protocol.HTTP
    """The listener whose refusals this protocol counts: each server sets its own."""

    def refuse(self, reason: Reason, status: int | None, message: str) -> None:
        """Count the refusal, answer ``status`` (None: close without a word) unless a response
        is half-written, and close. The application then sees a disconnect. A caller whose
        request was already answered passes None: one request, one response."""
        REFUSALS.count(self.listener, reason)
        cycle = self.cycle
        mid_response = False
        if cycle is not None and not cycle.response_complete:
            mid_response = cycle.response_started
            # At once rather than at connection_lost: receive() returns http.disconnect and
            # send() writes nothing, so no late answer follows this one.
            cycle.disconnected = True
            cycle.message_event.set()
        if status is not None and not mid_response and not self.transport.is_closing():
            self.transport.write(self._error_response(status, message))
        self.transport.close()

    def _error_response(self, status: int, message: str) -> bytes:
        body = encode_error(message)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: application/json\r\n")
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        return b"".join(head) + body
