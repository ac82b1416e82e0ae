"""The plan a latency objective makes for the batch being formed (``batcher.py``).

A batch that could still grow may wait for company until its oldest request must go to
finish within the objective: the objective, less ``OBJECTIVE_MARGIN`` of it for what happens
outside the batch, less the predicted time of the batch it would join, less a margin for
what such plans recently overran by (``overrun.py``). The margin takes at most half the time
the batch has to spare: past that, shorter waits shrink the batches, which costs the event
loop more per request, which makes the overruns longer still. Uncapped, on two shared cores
at 80 % load, batches fell to 2-5 requests and the share within the objective to 0-19 %,
where half the objective as a fixed delay kept 43-94 % (``bench/NOTES.md``).
"""

from __future__ import annotations

from collections.abc import Callable

from batchserve.core.errors import Unavailable
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.overrun import Overrun
from batchserve.scheduler.work import Outcome, WorkItem

OBJECTIVE_MARGIN = 0.1
"""Share of a latency objective kept for what happens outside the batch: decoding before
the queue, encoding and sending after the run."""


class ObjectivePlan:
    """One model version's latency objective: when its forming batch must go, when each
    started batch should finish, and what the plans overran by. Times are on the batcher's
    clock, in nanoseconds."""

    def __init__(self, objective_ns: int, stats: ModelStats) -> None:
        self.objective_ns = objective_ns
        self._stats = stats
        self._overrun = Overrun()
        self._go_ns: int | None = None
        """When the plan had the batch being formed go, so that a wake-up that fired late
        counts as overrun; None while no plan was made for it."""

    def forming(self) -> None:
        """A new batch is being formed: nothing is planned for it yet."""
        self._go_ns = None

    def due(self, oldest_ns: int, predicted_ns: int) -> int:
        """The latest the batch may go for its oldest request (queued at ``oldest_ns``) to
        finish within the objective, ``predicted_ns`` being the time of the batch it would
        join, keeping free what plans recently overran by, up to half the time to spare."""
        spare = int(self.objective_ns * (1 - OBJECTIVE_MARGIN)) - predicted_ns
        self._go_ns = oldest_ns + spare - min(self._overrun.margin_ns, max(0, spare) // 2)
        return self._go_ns

    def started(self, batch: list[WorkItem], now_ns: int, predicted_ns: int) -> None:
        """``batch`` went at ``now_ns``: it should finish ``predicted_ns`` after it, or after
        its due time when that was earlier (a late wake-up is the plan's overrun too)."""
        planned = now_ns if self._go_ns is None else min(now_ns, self._go_ns)
        for item in batch:
            item.planned_finish_ns = planned + predicted_ns

    def answered(self, item: WorkItem, answered_ns: int) -> None:
        """``item``'s response was ready at ``answered_ns``: how far past its batch's planned
        finish teaches the margin."""
        if item.planned_finish_ns:
            self._overrun.record(answered_ns - item.planned_finish_ns)
            self._stats.objective_margin_ns = self._overrun.margin_ns

    def refuse_late(
        self,
        batch: list[WorkItem],
        now_ns: int,
        predicted_ns: int,
        settle: Callable[[WorkItem, Outcome], None],
    ) -> list[WorkItem]:
        """Refuse (503) the requests of ``batch`` that cannot finish within the objective,
        by the prediction alone (the margin is what plans miss by now and then, and a request
        that would make it without one is served); the others are kept."""
        finish = now_ns + predicted_ns
        kept = []
        for item in batch:
            if finish > item.enqueued_ns + self.objective_ns:
                settle(item, Unavailable(
                    f"request cannot finish within the model's latency objective of "
                    f"{self.objective_ns // 1000} us (refuse_late_requests): it waited "
                    f"{(now_ns - item.enqueued_ns) // 1000} us and its batch is predicted to "
                    f"take {predicted_ns // 1000} us; retry, or send it to a less loaded replica"
                ))  # fmt: skip
            else:
                kept.append(item)
        return kept
