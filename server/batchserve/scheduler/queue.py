"""A bounded queue with one FIFO per priority level."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from batchserve.errors import Overloaded
from batchserve.scheduler.work import WorkItem


class PriorityQueue:
    """FIFO within a level, higher levels (smaller numbers) first; bounded in total."""

    def __init__(self, levels: int, max_size: int) -> None:
        self._levels: list[deque[WorkItem]] = [deque() for _ in range(levels)]
        self._max_size = max_size
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: WorkItem) -> None:
        """Queue an item, or refuse at once when the queue is full."""
        if self._size >= self._max_size:
            raise Overloaded(f"queue is full ({self._max_size} requests waiting); retry later")
        self._levels[item.priority - 1].append(item)
        self._size += 1

    def peek(self) -> WorkItem | None:
        """The item that would be taken next."""
        return next((level[0] for level in self._levels if level), None)

    def pop(self) -> WorkItem:
        for level in self._levels:
            if level:
                self._size -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def oldest_enqueued_ns(self) -> int | None:
        """When the longest-waiting item arrived, across levels."""
        heads = [level[0].enqueued_ns for level in self._levels if level]
        return min(heads) if heads else None

    def __iter__(self) -> Iterator[WorkItem]:
        for level in self._levels:
            yield from level

    def samples_waiting(self, limit: int) -> int:
        """Samples queued, counting no further than ``limit``."""
        total = 0
        for item in self:
            total += item.batch_size
            if total >= limit:
                return total
        return total
