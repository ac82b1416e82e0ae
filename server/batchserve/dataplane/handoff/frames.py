"""The socket between a worker and the model-owning process: length-prefixed ``marshal``
frames of plain tuples, written together once per event-loop pass.

``marshal`` carries only built-in types, is the fastest codec in the standard library and
both ends are the same interpreter; tensor data never goes through it unless an arena was
full (then a request's bytes go inline, once).
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import struct
from collections.abc import Callable, Mapping
from typing import Any, cast

logger = logging.getLogger(__name__)

Frame = tuple[Any, ...]
_LENGTH = struct.Struct("<I")
STREAM_CREDIT = 32
"""Responses to one decoupled request the model-owning process sends ahead of the worker's
client: the worker gives credit back (an "a" frame) as its client takes them, so a client
that reads slowly holds its model's responder instead of filling the worker's memory."""


class FrameProtocol(asyncio.Protocol):
    """Frames in, one ``handle`` call each; ``send`` queues frames written together.
    ``read``, when given, is called after the frames of each read have been handled."""

    def __init__(
        self,
        handle: Callable[[Frame], None],
        lost: Callable[[], None],
        read: Callable[[], None] | None = None,
    ) -> None:
        self._handle = handle
        self._lost = lost
        self._read = read
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lost()

    @property
    def connected(self) -> bool:
        return self._transport is not None

    def send(self, frame: Frame) -> None:
        data = marshal.dumps(frame)
        outgoing = self._outgoing
        if not outgoing:
            self._loop.call_soon(self._flush)
        outgoing.append(_LENGTH.pack(len(data)))
        outgoing.append(data)

    def send_now(self, frame: Frame) -> None:
        """``send``, with the frames queued before it, written before this returns: for a
        frame that must reach the other process ahead of an answer this one writes on
        another socket as soon as it returns."""
        self.send(frame)
        self._flush()

    def _flush(self) -> None:
        transport = self._transport
        if transport is not None and self._outgoing:
            transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, end = 0, len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if end - start - 4 < length:
                break
            frame = marshal.loads(memoryview(buffer)[start + 4 : start + 4 + length])
            start += 4 + length
            self._handle(frame)
        del buffer[:start]
        if self._read is not None:
            self._read()

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()


def dispatch(handlers: Mapping[str, Callable[[Frame], None]], peer: str) -> Callable[[Frame], None]:
    """Each frame to the handler its tag names; a frame this side cannot read is logged
    (``peer`` says whose it was) and must not close the link."""

    def handle(frame: Frame) -> None:
        try:
            handlers[frame[0]](frame)
        except Exception:
            logger.exception("frame not understood", extra={"peer": peer, "tag": str(frame[0])})

    return handle


def pack_frame(frame: Frame) -> bytes:
    """One frame, for a blocking write before either event loop runs."""
    data = marshal.dumps(frame)
    return _LENGTH.pack(len(data)) + data


def read_frame(read: Callable[[int], bytes]) -> Frame:
    """One frame from a blocking ``read(n)`` that returns exactly n bytes (or raises)."""
    (length,) = _LENGTH.unpack(read(4))
    frame = marshal.loads(read(length))
    assert isinstance(frame, tuple)
    return frame
