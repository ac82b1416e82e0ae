"""Triton's ``timeout_action: DELAY`` in the batcher: a request past its queue timeout is
moved behind the requests still within theirs, at its timeout, and still answered."""

from __future__ import annotations

import asyncio
import time

import pytest
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend
from harness import answers, hold_first, item, make_batcher

pytestmark = pytest.mark.anyio

DELAYING = (
    "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
    "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 50000 } "
    "priority_queue_policy { key: 2 value: { default_timeout_microseconds: 0 } } }"
)


def _finishing_order(*items: WorkItem) -> list[str]:
    """The names of ``items`` as their answers come (one instance: the order they ran)."""
    order: list[str] = []
    for name, one in zip("abcdefgh", items, strict=False):
        one.future.add_done_callback(lambda _, name=name: order.append(name))
    return order


async def test_a_request_past_its_timeout_runs_after_later_timely_ones_but_before_lower_levels(
) -> None:  # fmt: skip
    backend = FakeBackend()
    batcher = make_batcher([backend], DELAYING, max_batch_size=1)
    first = await hold_first(batcher, backend)
    late = item(1, 1.0)
    late.delay_at_ns = time.monotonic_ns() + 50_000_000  # as admission sets it
    batcher.submit(late)
    await asyncio.sleep(0.15)  # its timeout passes while the instance is busy
    assert late.delayed  # delayed, not refused
    assert not late.future.done()
    timely = [item(1, 2.0), item(1, 3.0)]
    lower = item(1, 4.0, priority=2)
    order = _finishing_order(late, *timely, lower)
    for one in (*timely, lower):
        batcher.submit(one)
    backend.gate.set()
    await answers(first, late, *timely, lower)
    assert order == ["b", "c", "a", "d"]
    assert backend.batches == [1, 1, 1, 1, 1]


async def test_without_delay_the_same_requests_run_in_arrival_order() -> None:
    """The control: the same arrivals, none with a delay time, keep their order."""
    backend = FakeBackend()
    batcher = make_batcher([backend], DELAYING, max_batch_size=1)
    first = await hold_first(batcher, backend)
    early = item(1, 1.0)
    batcher.submit(early)
    await asyncio.sleep(0.15)
    timely = [item(1, 2.0), item(1, 3.0)]
    order = _finishing_order(early, *timely)
    for one in timely:
        batcher.submit(one)
    backend.gate.set()
    await answers(first, early, *timely)
    assert order == ["a", "b", "c"]
