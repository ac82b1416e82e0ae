"""The event loop keeps polling for a window after each request, then sleeps again."""

from __future__ import annotations

import asyncio
import time

import pytest
from batchserve.dataplane.busy_poll import BusyPoll
from fakes import ManualClock

pytestmark = pytest.mark.anyio

WINDOW_NS = 1_000_000


async def _passes(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_off_by_default_schedules_nothing() -> None:
    poll = BusyPoll(0)
    poll.touch()
    assert not poll.polling


async def test_polls_until_a_window_passes_without_a_touch() -> None:
    clock = ManualClock()
    poll = BusyPoll(WINDOW_NS, clock)
    poll.touch()
    assert poll.polling
    await _passes(5)
    assert poll.polling  # no time has passed: still inside the window
    clock.advance(WINDOW_NS // 2)
    poll.touch()  # a request inside the window starts a new one
    clock.advance(WINDOW_NS // 2 + 1)
    await _passes(5)
    assert poll.polling
    clock.advance(WINDOW_NS // 2)
    await _passes(2)
    assert not poll.polling
    poll.touch()  # the next request starts polling again
    assert poll.polling


async def test_other_work_runs_on_time_while_polling() -> None:
    poll = BusyPoll(200_000_000)  # 200 ms of real time
    poll.touch()
    started = time.monotonic()
    await asyncio.sleep(0.02)  # a timer fires although the loop never sleeps
    assert 0.02 <= time.monotonic() - started < 1.0
    assert poll.polling
    while poll.polling:
        await asyncio.sleep(0.01)
    assert 0.2 <= time.monotonic() - started < 5
