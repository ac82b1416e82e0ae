"""One socket write per HTTP response instead of one per ASGI message.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body
on ``http.response.body``: two ``send()`` calls, and the client is woken for a head it
cannot use without the body. On the 2-core reference machine the server's main thread
spent about a third of its time in those writes under load (bench/NOTES.md). Holding
writes until the response is complete (or, for writes outside a response such as
``100 Continue``, until the end of the current event-loop iteration) and sending them with
one ``writelines`` (a single ``writev``) keeps every byte and its order, and costs one
``call_soon`` per response.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport(asyncio.Transport):
    """Wraps a transport: writes made in one loop iteration leave together."""

    __slots__ = ("_inner", "_loop", "_pending")

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        """Hand everything held so far to the real transport (a no-op when nothing is)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._inner.is_closing():
            self._inner.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def abort(self) -> None:
        self._pending.clear()
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + sum(len(p) for p in self._pending)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        inner = cast(asyncio.Transport, transport)
        super().connection_made(CoalescingTransport(inner, self.loop))

    def on_response_complete(self) -> None:
        """Send the whole response now: waiting for the end of the loop iteration would
        only add that iteration to its latency."""
        cast(CoalescingTransport, self.transport).flush()
        super().on_response_complete()
