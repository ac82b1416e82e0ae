"""The timing primitives: the smoothed arrival gap, the loop timer, the single wake-up."""

from __future__ import annotations

import asyncio
import time

import pytest
from batchserve.scheduler.timing import ArrivalGaps, LoopTimer, WakeUp
from fakes import ManualClock

pytestmark = pytest.mark.anyio

MS = 1_000_000


def test_arrival_gaps_count_only_arrivals_that_find_company() -> None:
    gaps = ArrivalGaps()
    gaps.arrival(0, joined=False)
    gaps.arrival(500, joined=False)  # nobody was queued: says nothing about company
    assert gaps.expected_gap_ns() == float("inf")
    gaps.arrival(1300, joined=True)
    assert gaps.expected_gap_ns() == 800
    gaps.arrival(1300 + 1600, joined=True)
    assert gaps.expected_gap_ns() == 800 + (1600 - 800) / 8
    gaps.lonely(2000)  # waited 2000 ns for nobody: counted as 4000
    assert gaps.expected_gap_ns() == 900 + (4000 - 900) / 8


async def test_the_loop_timer_calls_back_no_earlier_than_asked() -> None:
    fired = asyncio.Event()
    start = time.monotonic_ns()
    LoopTimer(time.monotonic_ns).call_at(start + 2 * MS, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert time.monotonic_ns() - start >= 2 * MS


def test_a_wake_up_keeps_only_the_earliest_time_asked() -> None:
    clock, fired = ManualClock(), []
    wake = WakeUp(clock, lambda: fired.append(clock()))
    start = clock()
    wake.at(start + 300)
    wake.at(start + 500)  # later: the earlier one looks again anyway
    assert clock.pending == [start + 300]
    wake.at(start + 100)  # earlier: replaces it
    assert clock.pending == [start + 100]
    clock.advance(1000)
    assert fired == [start + 1000]


def test_after_firing_a_wake_up_can_be_set_again_and_cancelled() -> None:
    clock, fired = ManualClock(), []
    wake = WakeUp(clock, lambda: fired.append(clock()))
    start = clock()
    wake.at(start + 100)
    clock.advance(100)
    wake.at(start + 900)  # the fired one no longer holds it back
    assert clock.pending == [start + 900]
    wake.cancel()
    assert clock.pending == []
    clock.advance(1000)
    assert fired == [start + 100]


def test_one_long_gap_between_arrivals_counts_as_a_few_expected_ones() -> None:
    """A loop off the CPU for 260 ms finds its arrivals after one long gap: it must not make
    the expected gap longer than a queue delay, after which nothing would wait at all."""
    gaps = ArrivalGaps()
    gaps.arrival(0, joined=False)
    gaps.arrival(1000, joined=True)
    gaps.arrival(1000 + 260_000_000, joined=True)
    assert gaps.expected_gap_ns() == 1000 + (ArrivalGaps.CLIP * 1000 - 1000) / 8
    gaps.lonely(1_000_000)  # the batcher's own wait is not clipped
    assert gaps.expected_gap_ns() > 200_000


def test_two_requests_in_one_pass_show_company_no_later_than_that_pass() -> None:
    gaps = ArrivalGaps()
    gaps.arrival(0, joined=False)
    gaps.arrival(300_000, joined=False)
    gaps.together()  # a second request in the pass at 300 us
    assert gaps.expected_gap_ns() == 300_000
    gaps.together()  # a third: the pass is counted once
    assert gaps.expected_gap_ns() == 300_000
    gaps.arrival(5_000_000, joined=False)
    gaps.together()  # 4.7 ms after the pass before: later than expected, says nothing new
    assert gaps.expected_gap_ns() == 300_000


def test_an_arrival_stamped_before_the_last_one_is_no_negative_gap() -> None:
    """Arrival times that go back (stamped elsewhere) count as coming together: a negative
    expected gap would end every wait before it began."""
    gaps = ArrivalGaps()
    gaps.arrival(0, joined=False)
    gaps.arrival(400_000, joined=True)
    gaps.arrival(100_000, joined=True)
    assert gaps.expected_gap_ns() == 400_000 * 7 / 8
    assert gaps.last_ns == 400_000
