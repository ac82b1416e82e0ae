"""The queue: its bound on the lengths it holds (which spares a sequence batcher a walk),
its limits, and Triton's DELAY action."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from batchserve.core.errors import Overloaded
from batchserve.scheduler.queue import PriorityQueue
from batchserve.scheduler.work import WorkItem


def test_the_longest_length_queued_is_kept_until_the_queue_empties() -> None:
    async def run() -> list[int]:
        loop = asyncio.get_running_loop()
        queue = PriorityQueue(max_size=8, aging_ns=10**9)

        def item(length: int, priority: int = 1) -> WorkItem:
            future = loop.create_future()
            return WorkItem({}, 1, (), priority, 0, None, future, row_positions=length)

        seen = []
        for length in (30, 90, 10):
            queue.push(item(length))
        seen.append(queue.longest)
        queue.pop(0)
        seen.append(queue.longest)  # an upper bound: 90 may still be queued
        taken = queue.pop_many(2, 0)
        seen.append(queue.longest)  # empty
        queue.push_front(taken)
        seen.append(queue.longest)
        gone = item(200, priority=2)
        queue.push(gone)
        gone.future.cancel()
        queue.pop_many(2, 0)
        seen.append(queue.longest)  # the abandoned one is still queued
        assert queue.remove_abandoned() == [gone]
        seen.append(queue.longest)
        return seen

    assert asyncio.run(run()) == [90, 90, 0, 90, 200, 0]


def test_the_limits_count_requests_not_items() -> None:
    """A worker's group is one item of several requests: the queue's and a level's limits
    count its requests, as Triton's count each client's."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        queue = PriorityQueue(max_size=8, aging_ns=10**9, level_sizes={2: 3})

        def item(clients: int, priority: int = 1) -> WorkItem:
            return WorkItem({}, clients, (), priority, 0, None, loop.create_future(),
                            clients=clients)  # fmt: skip

        queue.push(item(6))
        assert not queue.full_for(1, 2)
        assert queue.full_for(1, 3)
        with pytest.raises(Overloaded, match=r"^Exceeds maximum queue size \(batchserve: "):
            queue.push(item(3))
        queue.push(item(2, priority=2))
        assert queue.full_for(2)  # the queue: 8 of 8
        taken = queue.pop(0)
        assert taken.clients == 6
        assert queue.full_for(2, 2)  # its level: 2 of 3
        assert not queue.full_for(2, 1)
        queue.push_front([taken])
        assert queue.full_for(1)
        assert len(queue) == 2  # items

    asyncio.run(run())


def test_a_delayed_request_waits_behind_its_levels_timely_ones_and_ahead_of_lower_levels() -> None:
    """Triton's ``timeout_action: DELAY`` (its PolicyQueue: a level's queue, then its delayed
    queue, level by level): the order ``pop``, ``peek`` and iteration give, whatever
    arrives after the delay, and after ``push_front`` returns taken requests."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        queue = PriorityQueue(max_size=16, aging_ns=10**12)

        def item(name: str, priority: int, at: int, delay_at: int | None = None) -> WorkItem:
            return WorkItem({name: np.zeros(1)}, 1, (), priority, at, None, loop.create_future(),
                            delay_at_ns=delay_at)  # fmt: skip

        def names() -> list[str]:
            return [next(iter(item.inputs)) for item in queue]

        queue.push(item("a", 1, 0, delay_at=100))
        queue.push(item("b", 1, 10, delay_at=10**9))
        queue.push(item("low", 2, 20))
        assert queue.earliest_delay_ns() == 100
        assert not queue.delay_expired(99)
        assert queue.delay_expired(100)
        assert queue.earliest_delay_ns() == 10**9
        queue.push(item("c", 1, 150))  # arrives after a was delayed: goes before it
        assert names() == ["b", "c", "a", "low"]
        assert queue.oldest_enqueued_ns() == 0  # the delayed one still times the batch
        taken = queue.pop_many(3, 200)
        assert [next(iter(t.inputs)) for t in taken] == ["b", "c", "a"]
        assert taken[2].delayed
        assert taken[2].delay_at_ns is None
        queue.push_front(taken)
        queue.push(item("d", 1, 300))
        assert names() == ["b", "c", "d", "a", "low"]
        assert queue.delay_expired(10**9)  # b too now: behind a, which was delayed first
        assert names() == ["c", "d", "a", "b", "low"]
        assert [next(iter(queue.pop(10**9).inputs)) for _ in range(5)] == [
            "c", "d", "a", "b", "low"
        ]  # fmt: skip
        assert not queue
        assert queue.levels_in_use == 0
        assert queue.peek(0) is None

    asyncio.run(run())


def test_only_a_timely_head_ages_past_a_higher_level() -> None:
    """batchserve's aging lets a lower level's old head go first; a delayed head never does
    (Triton's DELAY may wait as long as timely requests keep coming), though an aged head
    older than a higher level's delayed one still goes before it."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        queue = PriorityQueue(max_size=16, aging_ns=1_000)

        def item(name: str, priority: int, at: int, delay_at: int | None = None) -> WorkItem:
            return WorkItem({name: np.zeros(1)}, 1, (), priority, at, None, loop.create_future(),
                            delay_at_ns=delay_at)  # fmt: skip

        queue.push(item("old_low", 2, 0, delay_at=5))
        queue.push(item("high", 1, 10))
        queue.delay_expired(5)  # old_low is delayed: it does not age past high
        assert next(iter(queue.peek(10**6).inputs)) == "high"  # type: ignore[union-attr]
        queue.pop(10**6)
        queue.push(item("delayed_high", 1, 20, delay_at=25))
        queue.push(item("aged_low", 2, 30))
        queue.delay_expired(25)
        # aged_low (timely, aged) is younger than delayed_high: it waits
        assert next(iter(queue.peek(10**6).inputs)) == "delayed_high"  # type: ignore[union-attr]
        queue.push(item("older_low", 3, 15))
        assert next(iter(queue.peek(10**6).inputs)) == "older_low"  # type: ignore[union-attr]
        removed = queue.remove_where(lambda one: "old_low" in one.inputs)
        assert [next(iter(r.inputs)) for r in removed] == ["old_low"]
        assert len(queue) == 3

    asyncio.run(run())
