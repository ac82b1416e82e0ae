"""The queue's bound on the lengths it holds, which spares a sequence batcher a walk."""

from __future__ import annotations

import asyncio

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
