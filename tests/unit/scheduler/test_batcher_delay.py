"""``max_queue_delay``: Triton's dispatch rules, and not waiting when no company can come.

Time is a ManualClock: nothing moves unless the test advances it. Whether a request was
dispatched is visible synchronously: ``submit`` starts a batch before it returns.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.timing import ArrivalGaps, LoopTimer
from fakes import FakeBackend, ManualClock
from harness import answer, answers, hold_first, item, make_batcher

pytestmark = pytest.mark.anyio

US = 1_000
MS = 1_000_000


def _delayed(clock: ManualClock, backend: FakeBackend, delay_us: int = 1000) -> Batcher:
    extra = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}"
    return make_batcher([backend], clock=clock, extra=extra)


def _arrivals(batcher: Batcher, clock: ManualClock, gap_ns: int, count: int) -> None:
    """A history of ``count`` arrivals ``gap_ns`` apart, the last one ``gap_ns`` ago.

    Their clients are already gone, so they shape the arrival rate and cost nothing else.
    """
    for _ in range(count):
        gone = item(1, 1.0, at=clock)
        gone.future.cancel()
        batcher.submit(gone)
        clock.advance(gap_ns)
    assert not batcher.queue


async def test_a_lone_request_on_an_idle_model_does_not_wait() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1_000_000)
    lone = item(1, 1.0, at=clock)
    batcher.submit(lone)
    assert batcher.pool.busy_count() == 1  # dispatched inside submit, the clock unmoved
    assert (await answer(lone))["y"][0, 0] == 3.0
    assert clock.pending == []


@pytest.mark.parametrize(
    ("gap_us", "waits"),
    [(100, True), (900, True), (1100, False), (5000, False)],
)
async def test_steady_arrivals_wait_only_if_the_next_can_come_within_the_delay(
    gap_us: int, waits: bool
) -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    _arrivals(batcher, clock, gap_us * US, 4)
    probe = item(1, 2.0, at=clock)
    batcher.submit(probe)
    assert batcher.pool.busy_count() == (0 if waits else 1)
    assert clock.pending == ([probe.enqueued_ns + 1 * MS] if waits else [])
    clock.advance(1 * MS)
    assert (await answer(probe))["y"][0, 0] == 5.0


async def test_a_waiting_request_goes_when_its_delay_is_out() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    _arrivals(batcher, clock, 10 * US, 3)
    a = item(1, 2.0, at=clock)
    batcher.submit(a)
    clock.advance(10 * US)
    b = item(1, 3.0, at=clock)
    batcher.submit(b)
    clock.advance(1 * MS - 10 * US - 1)
    assert len(batcher.queue) == 2  # one nanosecond short of a's delay
    clock.advance(1)
    assert not batcher.queue
    await answers(a, b)
    assert backend.batches == [2]


async def test_a_long_pause_means_no_company_is_expected() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    _arrivals(batcher, clock, 10 * US, 8)  # a busy spell, arrivals 10 us apart
    clock.advance(10 * MS)  # then silence
    lone = item(1, 1.0, at=clock)
    batcher.submit(lone)
    assert batcher.pool.busy_count() == 1
    await answer(lone)


async def test_the_largest_preferred_size_reached_goes_at_once() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 "
        "preferred_batch_size: [2, 4] }",
    )
    first = await hold_first(batcher, backend, at=clock)
    items = [item(1, float(i), at=clock) for i in range(7)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, *items[:6])
    assert backend.batches == [1, 4, 2]  # 7 queued: the largest preferred, then 2 of 3
    assert len(batcher.queue) == 1
    clock.advance(60_000 * MS)
    await answer(items[6])
    assert backend.batches == [1, 4, 2, 1]


async def test_a_full_batch_goes_at_once_and_the_rest_waits() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        max_batch_size=4,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }",
    )
    first = await hold_first(batcher, backend, at=clock)
    items = [item(rows, 1.0, at=clock) for rows in (1, 2, 2, 1)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, items[0], items[1])
    assert backend.batches == [1, 3]  # 1 + 2 = 3: the next 2 would pass the cap of 4
    assert len(batcher.queue) == 2
    clock.advance(60_000 * MS)
    await answers(items[2], items[3])
    assert backend.batches == [1, 3, 3]


async def test_a_request_larger_than_every_preferred_size_does_not_wait() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 "
        "preferred_batch_size: [2] }",
    )
    first = await hold_first(batcher, backend, at=clock)
    big = item(3, 1.0, at=clock)
    batcher.submit(big)
    backend.gate.set()
    await answers(first, big)
    assert backend.batches == [1, 3]


async def test_without_a_delay_batches_are_greedy() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="dynamic_batching { preferred_batch_size: [4] }"
    )
    first = await hold_first(batcher, backend, at=clock)
    items = [item(1, 1.0, at=clock) for _ in range(3)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, *items)
    assert backend.batches == [1, 3]
    assert clock.pending == []


def test_arrival_gaps_start_unknown_then_follow_a_weighted_mean() -> None:
    gaps = ArrivalGaps()
    gaps.record(0)
    assert gaps.expected_gap_ns() == float("inf")
    gaps.record(800)
    assert gaps.expected_gap_ns() == 800
    gaps.record(800 + 1600)
    assert gaps.expected_gap_ns() == 800 + (1600 - 800) / 8


async def test_the_loop_timer_calls_back_no_earlier_than_asked() -> None:
    fired = asyncio.Event()
    start = time.monotonic_ns()
    LoopTimer(time.monotonic_ns).call_at(start + 2 * MS, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert time.monotonic_ns() - start >= 2 * MS
