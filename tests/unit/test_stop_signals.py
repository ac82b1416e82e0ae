"""The first stop signal stops, every later one hurries: the shutdown delay ends at once."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import pytest
from batchserve.runtime.stop_signals import SIGNALS, StopSignals

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


async def test_the_delivery_hook_runs_as_the_signal_arrives_and_the_loop_handles_it_after() -> None:
    """The loop runs its handler after the I/O of the pass that saw the signal; the hook runs
    in Python's own signal handler, before the loop dispatches anything more."""
    loop = asyncio.get_running_loop()
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    signals = StopSignals()
    delivered: list[tuple[int, bool]] = []
    try:
        signals.install(loop, lambda n: delivered.append((n, signals.stopping.is_set())))
        signal.raise_signal(signal.SIGTERM)
        assert delivered == [(1, False)]  # at once, and before the loop's handler
        assert not signals.stopping.is_set()
        await asyncio.wait_for(signals.stopping.wait(), 2)
        signal.raise_signal(signal.SIGINT)
        assert delivered == [(1, False), (2, True)]
        await asyncio.wait_for(signals.hurried.wait(), 2)
        assert (signals.count, signals.delivered) == (2, 2)
    finally:
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
