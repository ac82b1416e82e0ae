"""The first stop signal stops, every later one hurries: the shutdown delay ends at once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from batchserve.runtime.stop_signals import StopSignals

pytestmark = pytest.mark.anyio


async def test_the_first_signal_stops_without_hurrying() -> None:
    signals = StopSignals()
    signals.receive("SIGTERM")
    assert signals.stopping.is_set()
    assert not signals.hurried.is_set()


async def test_a_second_signal_cuts_the_delay_short_and_later_ones_change_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "batchserve.runtime.stop_signals")
    signals = StopSignals()
    signals.receive("SIGINT")
    started = time.monotonic()
    delay = asyncio.ensure_future(signals.delay(30))
    await asyncio.sleep(0.05)
    assert not delay.done()
    signals.receive("SIGINT")
    await asyncio.wait_for(delay, 2)
    signals.receive("SIGTERM")
    assert time.monotonic() - started < 2
    assert signals.hurried.is_set()
    hurried = [r for r in caplog.records if r.getMessage().startswith("drain hurried")]
    assert [r.__dict__["signals"] for r in hurried] == [2, 3]
    assert any(r.getMessage() == "shutdown delay cut short" for r in caplog.records)


async def test_the_delay_runs_its_full_length_when_nobody_hurries() -> None:
    signals = StopSignals()
    started = time.monotonic()
    await signals.delay(0.2)
    assert time.monotonic() - started >= 0.2
