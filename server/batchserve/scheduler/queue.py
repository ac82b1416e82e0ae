"""A bounded queue with one FIFO per priority level, and aging across levels.

Levels are strict (1 first), except that a head which has waited longer than the aging
bound competes as if it were top level, oldest first: sustained high-priority load
delays lower levels by at most that bound plus the older backlog, never forever.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from batchserve.core.errors import Overloaded
from batchserve.scheduler.work import WorkItem


class PriorityQueue:
    """FIFO within a level, higher levels (smaller numbers) first; bounded in total."""

    def __init__(self, levels: int, max_size: int, aging_ns: int) -> None:
        self._levels: list[deque[WorkItem]] = [deque() for _ in range(levels)]
        self._max_size = max_size
        self._aging_ns = aging_ns
        self._size = 0
        self.samples = 0
        """Samples queued (an upper bound: abandoned items count until they leave)."""

    def __len__(self) -> int:
        return self._size

    def push(self, item: WorkItem) -> None:
        """Queue an item, or refuse at once when the queue is full."""
        if self._size >= self._max_size:
            raise Overloaded(f"queue is full ({self._max_size} requests waiting); retry later")
        self._levels[item.priority - 1].append(item)
        self._size += 1
        self.samples += item.batch_size

    @property
    def full(self) -> bool:
        return self._size >= self._max_size

    def remove_abandoned(self) -> list[WorkItem]:
        """Take out every item nobody waits for any more, keeping the others' order.

        Called when the queue is full: a client that went away must not hold its place
        until an instance is free to drop it (new requests would be refused meanwhile).
        """
        removed: list[WorkItem] = []
        for level in self._levels:
            for _ in range(len(level)):
                item = level.popleft()
                if item.abandoned():
                    removed.append(item)
                else:
                    level.append(item)
        self._size -= len(removed)
        self.samples -= sum(item.batch_size for item in removed)
        return removed

    def peek(self, now_ns: int) -> WorkItem | None:
        """The item that would be taken next at ``now_ns``."""
        level = self._front(now_ns)
        return level[0] if level else None

    def pop(self, now_ns: int) -> WorkItem:
        level = self._front(now_ns)
        if not level:
            raise IndexError("pop from an empty queue")
        item = level.popleft()
        self._size -= 1
        self.samples -= item.batch_size
        return item

    def pop_many(self, count: int, now_ns: int) -> list[WorkItem]:
        """Up to ``count`` items in the order ``pop`` would give them."""
        return [self.pop(now_ns) for _ in range(min(count, self._size))]

    def push_front(self, items: Iterable[WorkItem]) -> None:
        """Return items taken by ``pop``/``pop_many`` (in that order) to where they were."""
        for item in reversed(list(items)):
            self._levels[item.priority - 1].appendleft(item)
            self._size += 1
            self.samples += item.batch_size

    def oldest_enqueued_ns(self) -> int | None:
        """When the longest-waiting item arrived, across levels."""
        heads = [level[0].enqueued_ns for level in self._levels if level]
        return min(heads) if heads else None

    def __iter__(self) -> Iterator[WorkItem]:
        for level in self._levels:
            yield from level

    def _front(self, now_ns: int) -> deque[WorkItem] | None:
        levels = self._levels
        if len(levels) == 1:
            return levels[0]
        cutoff = now_ns - self._aging_ns
        chosen: deque[WorkItem] | None = None
        for level in levels:
            if level and (chosen is None or level[0].enqueued_ns < _aged_before(chosen, cutoff)):
                chosen = level
        return chosen


def _aged_before(chosen: deque[WorkItem], cutoff: int) -> int:
    """A lower level's head goes first if it arrived before this: aged, and older."""
    return min(cutoff + 1, chosen[0].enqueued_ns)
