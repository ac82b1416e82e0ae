"""``preserve_ordering``: requests complete in submission order, whatever order batches finish.

Each request takes a ticket when it is queued; an outcome whose ticket is not next is held
until every earlier request has its own (answered, failed, timed out or dropped).
"""

from __future__ import annotations

from batchserve.scheduler.work import Outcome, WorkItem


class InOrder:
    """Releases outcomes in ticket order."""

    def __init__(self) -> None:
        self._issued = 0
        self._next = 0
        self._held: dict[int, tuple[WorkItem, Outcome]] = {}

    def ticket(self) -> int:
        ticket = self._issued
        self._issued += 1
        return ticket

    def settle(self, item: WorkItem, outcome: Outcome) -> None:
        """Resolve ``item`` now if every earlier ticket is settled, else when they are."""
        if item.ticket != self._next:
            self._held[item.ticket] = (item, outcome)
            return
        item.finish(outcome)
        self._next += 1
        while (held := self._held.pop(self._next, None)) is not None:
            held[0].finish(held[1])
            self._next += 1
