"""Just enough HTTP/2 over a raw socket to act as a gRPC client that misbehaves: one that
never finishes its preface, or stops answering the server's pings."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM = 0x1
END_HEADERS = 0x4
CANCEL = 0x8  # RST_STREAM's error code
ACK_FLAG = 0x1


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    payload: bytes


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return head + payload


def grpc_call_headers(path: str) -> bytes:
    """A HEADERS block opening a gRPC call, each field a literal HPACK needs no table for."""
    fields = [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test"),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ]  # fmt: skip
    block = b""
    for name, value in fields:
        block += b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
    return block


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(sock: socket.socket) -> Frame | None:
    """The next frame, or None once the server has closed the connection."""
    head = _read_exactly(sock, 9)
    if head is None:
        return None
    payload = _read_exactly(sock, int.from_bytes(head[:3], "big"))
    return None if payload is None else Frame(head[3], head[4], payload)


def frames_until_closed(
    sock: socket.socket, timeout: float, answer_settings: bool = True
) -> tuple[list[Frame], float]:
    """Every frame the server sends until it closes the connection, and the seconds that
    took; the server's SETTINGS are acknowledged, its pings never answered."""
    started = time.monotonic()
    sock.settimeout(timeout)
    frames: list[Frame] = []
    while (received := read_frame(sock)) is not None:
        frames.append(received)
        if answer_settings and received.kind == SETTINGS and not received.flags & ACK_FLAG:
            sock.sendall(frame(SETTINGS, ACK_FLAG, 0))
    return frames, time.monotonic() - started


def goaway_reason(frames: list[Frame]) -> bytes | None:
    """The debug text of the server's GOAWAY (after last stream id and error code)."""
    for received in frames:
        if received.kind == GOAWAY:
            return received.payload[8:]
    return None
