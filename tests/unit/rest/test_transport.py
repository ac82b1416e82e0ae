"""CoalescingTransport: one writelines per loop iteration, nothing lost or reordered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from batchserve.rest.transport import CoalescingTransport

pytestmark = pytest.mark.anyio


class RecordingTransport(asyncio.Transport):
    """The inner transport: records what reaches it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[bytes]] = []
        self.events: list[str] = []
        self.closing = False

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.calls.append([bytes(part) for part in list_of_data])
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closing = True
        self.events.append("close")


async def _one_iteration() -> None:
    await asyncio.sleep(0)


async def test_writes_of_one_iteration_leave_in_one_call() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(memoryview(b"body"))
    assert inner.calls == []
    assert transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\n") + 4
    await _one_iteration()
    assert inner.calls == [[b"HTTP/1.1 200 OK\r\n\r\n", b"body"]]
    transport.write(b"next")
    await _one_iteration()
    assert inner.calls[1] == [b"next"]


async def test_close_sends_what_is_held_first() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert inner.events == ["write", "close"]
    await _one_iteration()  # the scheduled flush finds nothing left to send
    assert inner.calls == [[b"last words"]]


async def test_nothing_is_written_to_a_closing_transport() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"too late")
    inner.closing = True
    await _one_iteration()
    assert inner.calls == []
