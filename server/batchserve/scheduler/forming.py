"""Which queued requests make up the next batch.

The batcher (``batcher.py``) decides when a batch goes and how many samples it may take;
this decides which requests those are:
- the size it is ready at (the largest preferred size the queue reaches, or what it holds
  once the batch cannot grow);
- the head (always) and then queued requests in order, of equal shapes (Triton's rule); or,
  for a sequence model, the head's run of the cheapest cut by length
  (``length_buckets.py``), or queue order with buckets off;
- a batch split evenly into consecutive runs for several free CPU instances.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from batchserve.scheduler.length_buckets import (
    CANDIDATES,
    LOOKAHEAD,
    StepCost,
    closest_first,
    head_run,
)
from batchserve.scheduler.queue import PriorityQueue
from batchserve.scheduler.work import Outcome, WorkItem

Settle = Callable[[WorkItem, Outcome], None]
"""Answers a request taken from the queue that will not run (its client went away)."""


class BatchForming:
    """The requests of one model version's next batch, from its queue.

    Args:
        queue: the model version's queue.
        settle: answers requests found abandoned while taking.
        merge: requests may share a batch at all (False: one request a batch).
        grouping: a sequence model: requests of different lengths batch, padded.
        bucketed: grouping cuts the queue by length (``length_buckets.py``).
        step_cost: what a sequence step costs, for the cut.
        ragged: inputs whose shapes may differ within a batch (``batch_io.py``).
    """

    def __init__(
        self,
        queue: PriorityQueue,
        settle: Settle,
        *,
        merge: bool,
        grouping: bool,
        bucketed: bool,
        step_cost: StepCost,
        ragged: frozenset[str] = frozenset(),
    ) -> None:
        self._queue = queue
        self._ragged = ragged
        self._settle = settle
        self._merge = merge
        self._grouping = grouping
        self._bucketed = bucketed
        self._step_cost = step_cost
        self._cap = 1
        self._most_steps = 0
        self._preferred: frozenset[int] = frozenset()
        self._largest_preferred = self._smallest_preferred = 1
        self.prefers_sizes = False
        """Some preferred size lies below the cap: the queue may reach one short of it."""
        self._head: WorkItem | None = None
        self._blocked = False
        """A request queued behind ``_head`` cannot join its batch (``cut_short``)."""

    def set_cap(self, cap: int, preferred: tuple[int, ...]) -> None:
        """The batch cap now, and the configured preferred sizes (those above it are dropped)."""
        fitting = [size for size in preferred if size <= cap]
        self._cap = cap
        self._preferred = frozenset(fitting)
        self._largest_preferred = max(fitting, default=cap)
        self._smallest_preferred = min(fitting, default=cap)
        self.prefers_sizes = self._smallest_preferred < cap

    def set_most_steps(self, steps: int) -> None:
        """The positions (rows times a row's positions, padded) a batch may hold: a
        sequence model's steps, an image model's pixels (0: no bound)."""
        self._most_steps = steps

    def ready_size(self) -> int:
        """The largest preferred size the queue reaches, or what it holds once the batch
        cannot grow past the cap (or the largest preferred size) or its positions; 0 when
        neither holds."""
        queue, most = self._queue, self._most_steps
        full_by_steps = most and queue.samples * queue.longest > most  # (an upper bound)
        if queue.samples < self._smallest_preferred and not full_by_steps:
            return 0  # common case, O(1): nothing to walk
        limit, total, best, longest = self._largest_preferred, 0, 0, 0
        for item in queue:
            if item.abandoned():
                continue
            longest = max(longest, item.row_positions)
            grown = total + item.batch_size
            if total and (grown > limit or (most and grown * longest > most)):
                return best or total
            total += item.batch_size
            if total in self._preferred:
                best = total
            if total >= limit:
                return best or total
        return best

    def cut_short(self, now: int) -> bool:
        """Whether the head's batch cannot grow any more: a request queued behind it cannot
        join it (other shapes, or other optional inputs), and every later arrival queues
        behind that one (``take`` stops there). Waiting would then only delay it: Triton's
        dynamic batcher sends such a batch at once. Told for one priority level in use
        (where queue order is ``take``'s order); a sequence model pads instead."""
        queue = self._queue
        if self._grouping or not self._merge or queue.levels_in_use != 1:
            return False
        head = queue.peek(now)
        if head is not self._head:  # a new head: looked for once, up to a batch's worth
            self._head = head
            self._blocked = head is not None and self._blocked_behind(head)
        return self._blocked

    def queued(self, item: WorkItem) -> None:
        """``item`` joined the queue: whether it blocks the head's batch, in O(1)."""
        head = self._head
        if head is not None and not self._blocked and item.priority == head.priority:
            self._blocked = not same_shapes(head, item, self._ragged)

    def reordered(self) -> None:
        """The queue's order changed (delayed requests moved back): look for what blocks
        the head's batch afresh."""
        self._head = None

    def _blocked_behind(self, head: WorkItem) -> bool:
        samples = head.batch_size
        for item in self._queue:
            if item is head or item.abandoned():
                continue
            if not same_shapes(head, item, self._ragged):
                return True
            samples += item.batch_size
            if samples >= self._cap:
                return False  # the batch fills before the mismatch: it goes full anyway
        return False

    def take(self, target: int, now: int) -> list[WorkItem]:
        """The head (always) and then queued requests up to ``target`` samples."""
        queue = self._queue
        head = queue.pop(now)
        if not self._merge:
            return [head]
        if self._grouping:
            return self._take_grouped(head, target, now)
        most = self._most_steps
        if most and not self._ragged:  # equal shapes: every row holds the head's positions
            target = min(target, max(1, most // max(1, head.row_positions)))
        batch, size = [head], head.batch_size
        positions = head.batch_size * head.row_positions  # ragged rows: each its own
        while (item := queue.peek(now)) is not None and size + item.batch_size <= target:
            if not item.abandoned() and not same_shapes(head, item, self._ragged):
                break  # Triton's rule: without a sequence layout, only equal shapes batch
            if self._ragged and most and not item.abandoned():
                positions += item.batch_size * item.row_positions
                if positions > most:
                    break
            queue.pop(now)
            if item.abandoned():
                self._settle(item, asyncio.CancelledError())
            else:
                batch.append(item)
                size += item.batch_size
        return batch

    def _take_grouped(self, head: WorkItem, target: int, now: int) -> list[WorkItem]:
        """Like ``take``, but for a sequence model: the head's run of the cheapest cut by
        length (``length_buckets.py``), or, with buckets off, queue order to ``target``."""
        window = []
        for item in self._queue.pop_many(LOOKAHEAD * self._cap, now):
            if item.abandoned():
                self._settle(item, asyncio.CancelledError())
            else:
                window.append(item)
        keys = head.inputs.keys()  # requests sending other optional inputs never merge
        fitting = [item for item in window if item.inputs.keys() == keys]
        if self._bucketed:
            candidates = closest_first(head, fitting)[: CANDIDATES - 1]
            cost = self._step_cost
            batch = head_run(
                head, candidates, target, cost.rows, cost.batch_row_steps, self._most_steps
            )
        else:
            batch, size, longest = [head], head.batch_size, head.row_positions
            most = self._most_steps
            for item in fitting:
                padded = max(longest, item.row_positions)
                if size + item.batch_size <= target and (
                    not most or (size + item.batch_size) * padded <= most
                ):
                    batch.append(item)
                    size += item.batch_size
                    longest = padded
        taken = {id(item) for item in batch}
        self._queue.push_front(item for item in window if id(item) not in taken)
        return batch


def split_evenly(batch: list[WorkItem], parts: int) -> list[list[WorkItem]]:
    """At most ``parts`` runs of consecutive requests, each with about the same number of
    samples (a request is never divided); consecutive, so length-grouped batches stay so."""
    total = sum(item.batch_size for item in batch)
    groups: list[list[WorkItem]] = [[] for _ in range(min(parts, len(batch)))]
    start = 0
    for item in batch:  # by where the request's middle row falls
        groups[(2 * start + item.batch_size) * len(groups) // (2 * total)].append(item)
        start += item.batch_size
    return [group for group in groups if group]


def same_shapes(a: WorkItem, b: WorkItem, ragged: frozenset[str] = frozenset()) -> bool:
    """Whether every input of ``b`` has ``a``'s shape past the batch axis, but for the
    ``ragged`` ones, which a batch carries flat. Padding them to one shape is only safe for
    sequence models, whose outputs are cut back to each length."""
    if a.inputs.keys() != b.inputs.keys():  # optional inputs sent by one and not the other
        return False
    return all(
        b.inputs[name].shape[1:] == array.shape[1:]
        for name, array in a.inputs.items()
        if name not in ragged
    )
