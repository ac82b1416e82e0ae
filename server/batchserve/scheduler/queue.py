"""A bounded queue with one FIFO per priority level, and aging across levels.

Levels are strict (1 first), except that a head which has waited longer than the aging
bound competes as if it were top level, oldest first: sustained high-priority load
delays lower levels by at most that bound plus the older backlog, never forever.

A level exists only while it holds requests: a config may declare 2^64-1 levels (Triton's
field is a uint64), and one FIFO for each, made at load, took the server's memory until the
kernel killed it. Memory and the time to choose the next request follow the levels in use.

Triton's ``timeout_action: DELAY``: a request whose queue timeout passes moves to its
level's delayed FIFO, served once the level holds no request still within its timeout (and
before any lower level). A delayed request does not age: like Triton's, it may wait as long
as timely requests keep coming. Without delayed requests nothing here is walked for them.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from batchserve.core.errors import Overloaded
from batchserve.scheduler.work import WorkItem


class PriorityQueue:
    """FIFO within a level, higher levels (smaller numbers) first; bounded in total."""

    def __init__(
        self, max_size: int, aging_ns: int, level_sizes: Mapping[int, int] | None = None
    ) -> None:
        """However many levels the config declares (requests are checked against that
        before they come here), none is made until a request needs it. ``level_sizes``:
        the levels that hold at most so many requests of their own (Triton's
        ``priority_queue_policy`` ``max_queue_size``), within ``max_size`` in all."""
        self._levels: dict[int, deque[WorkItem]] = {}
        """The levels holding requests, by priority: their requests still within their
        timeouts (empty where a level holds only delayed ones)."""
        self._delayed: dict[int, deque[WorkItem]] = {}
        """Each level's delayed requests, where it has some."""
        self._in_use: list[int] = []
        """Their priorities, highest level (smallest number) first."""
        self._max_size = max_size
        self._level_sizes = {level: size for level, size in (level_sizes or {}).items() if size}
        self._aging_ns = aging_ns
        self._size = 0
        self._requests = 0
        """Requests queued: a worker's group is one item of several (``WorkItem.clients``),
        and the limits count requests, as Triton's do."""
        self._level_requests: dict[int, int] = {}
        self.samples = 0
        """Samples queued (an upper bound: abandoned items count until they leave)."""
        self.longest = 0
        """Longest ``row_positions`` queued since the queue was last empty (an upper bound):
        whether a sequence batch could be full by its steps, told without a walk."""

    def __len__(self) -> int:
        return self._size

    @property
    def levels_in_use(self) -> int:
        """Priority levels holding requests now."""
        return len(self._in_use)

    def push(self, item: WorkItem) -> None:
        """Queue an item, or refuse at once when the queue, or its level, has no room for
        its requests."""
        if self.full_for(item.priority, item.clients):
            level_size = self._level_sizes.get(item.priority)
            held = (
                f"{self._requests} requests waiting, of {self._max_size}"
                if self._requests + item.clients > self._max_size or level_size is None
                else f"{level_size} requests of priority level {item.priority} waiting"
            )
            raise Overloaded(  # Triton's words first, which L0_model_queue reads
                f"Exceeds maximum queue size (batchserve: queue is full, {held}; retry later)"
            )
        self._level(item.priority).append(item)
        self._counted(item, 1)
        self.longest = max(self.longest, item.row_positions)

    def _counted(self, item: WorkItem, sign: int) -> None:
        """Count ``item`` in (1) or out (-1)."""
        self._size += sign
        self.samples += sign * item.batch_size
        self._requests += sign * item.clients
        if not self._level_sizes:
            return  # no level has a limit of its own: nothing more to count
        level = item.priority
        held = self._level_requests.get(level, 0) + sign * item.clients
        if held:
            self._level_requests[level] = held
        else:  # no entry for a level holding nothing, as no FIFO (see the module's note)
            self._level_requests.pop(level, None)

    def _level(self, priority: int) -> deque[WorkItem]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
            insort(self._in_use, priority)
        return level

    def _drop_if_empty(self, priority: int) -> None:
        if self._levels[priority]:
            return
        if self._delayed:
            if self._delayed.get(priority):
                return
            self._delayed.pop(priority, None)
        del self._levels[priority]
        self._in_use.remove(priority)

    def delay_expired(self, now_ns: int) -> bool:
        """Move every request whose ``delay_at_ns`` has passed behind its level's timely
        ones (Triton's DELAY action), keeping order; whether any moved."""
        moved = False
        for priority in self._in_use:
            timely: deque[WorkItem] = deque()
            late = self._delayed.get(priority) or deque()
            for item in self._levels[priority]:
                due = item.delay_at_ns
                if due is not None and due <= now_ns:
                    item.delay_at_ns, item.delayed = None, True
                    late.append(item)
                else:
                    timely.append(item)
            if late:
                self._delayed[priority] = late
            moved = moved or len(timely) < len(self._levels[priority])
            self._levels[priority] = timely
        return moved

    def earliest_delay_ns(self) -> int | None:
        """When the next timely request is to be delayed; None when none will be."""
        due = [item.delay_at_ns for item in self if item.delay_at_ns is not None]
        return min(due) if due else None

    def full_for(self, priority: int, requests: int = 1) -> bool:
        """Whether ``requests`` of this level would be refused: no room for them in the
        queue or their level."""
        if self._requests + requests > self._max_size:
            return True
        level_size = self._level_sizes.get(priority)
        held = self._level_requests.get(priority, 0)
        return level_size is not None and held + requests > level_size

    def remove_abandoned(self) -> list[WorkItem]:
        """Take out every item nobody waits for any more, keeping the others' order.

        Called when the queue is full: a client that went away must not hold its place
        until an instance is free to drop it (new requests would be refused meanwhile).
        """
        return self.remove_where(WorkItem.abandoned)

    def remove_expired(self, now_ns: int) -> list[WorkItem]:
        """Take out every item whose deadline has passed, keeping the others' order: its
        client is answered at its deadline, not when an instance is next free."""
        return self.remove_where(
            lambda item: item.deadline_ns is not None and item.deadline_ns <= now_ns
        )

    def earliest_deadline_ns(self) -> int | None:
        deadlines = [item.deadline_ns for item in self if item.deadline_ns is not None]
        return min(deadlines) if deadlines else None

    def remove_where(self, condition: Callable[[WorkItem], bool]) -> list[WorkItem]:
        """Take out every item ``condition`` holds for, keeping the others' order."""
        removed: list[WorkItem] = []
        for priority in list(self._in_use):
            levels = [self._levels[priority]]
            if (delayed := self._delayed.get(priority)) is not None:
                levels.append(delayed)
            for level in levels:
                for _ in range(len(level)):
                    item = level.popleft()
                    if condition(item):
                        removed.append(item)
                    else:
                        level.append(item)
            self._drop_if_empty(priority)
        for item in removed:
            self._counted(item, -1)
        if not self._size:
            self.longest = 0
        return removed

    def peek(self, now_ns: int) -> WorkItem | None:
        """The item that would be taken next at ``now_ns``."""
        priority = self._front(now_ns)
        if priority is None:
            return None
        level = self._levels[priority]
        return level[0] if level else self._delayed[priority][0]

    def pop(self, now_ns: int) -> WorkItem:
        priority = self._front(now_ns)
        if priority is None:
            raise IndexError("pop from an empty queue")
        level = self._levels[priority]
        item = level.popleft() if level else self._delayed[priority].popleft()
        self._drop_if_empty(priority)
        self._counted(item, -1)
        if not self._size:
            self.longest = 0
        return item

    def pop_many(self, count: int, now_ns: int) -> list[WorkItem]:
        """Up to ``count`` items in the order ``pop`` would give them."""
        return [self.pop(now_ns) for _ in range(min(count, self._size))]

    def push_front(self, items: Iterable[WorkItem]) -> None:
        """Return items taken by ``pop``/``pop_many`` (in that order) to where they were."""
        for item in reversed(list(items)):
            level = self._level(item.priority)
            if item.delayed:
                self._delayed.setdefault(item.priority, deque()).appendleft(item)
            else:
                level.appendleft(item)
            self._counted(item, 1)
            self.longest = max(self.longest, item.row_positions)

    def oldest_enqueued_ns(self) -> int | None:
        """When the longest-waiting item arrived, across levels."""
        heads = [level[0].enqueued_ns for level in self._levels.values() if level]
        heads += [level[0].enqueued_ns for level in self._delayed.values() if level]
        return min(heads) if heads else None

    def __iter__(self) -> Iterator[WorkItem]:
        """In the order ``pop`` would give them, but for aging."""
        for priority in self._in_use:
            yield from self._levels[priority]
            if self._delayed:
                yield from self._delayed.get(priority, ())

    def _front(self, now_ns: int) -> int | None:
        """The level whose head goes next: the highest, unless a lower one's has aged."""
        in_use = self._in_use
        if len(in_use) <= 1:
            return in_use[0] if in_use else None
        levels = self._levels
        cutoff = now_ns - self._aging_ns
        chosen = in_use[0]
        head = levels[chosen][0] if levels[chosen] else self._delayed[chosen][0]
        for priority in in_use[1:]:
            level = levels[priority]  # (a delayed head does not age)
            if level and level[0].enqueued_ns < min(cutoff + 1, head.enqueued_ns):
                chosen, head = priority, level[0]  # aged, and older: it goes first
        return chosen
