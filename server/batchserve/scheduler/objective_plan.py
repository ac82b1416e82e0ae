"""The plan a latency objective makes for the batch being formed (``batcher.py``).

A batch that could still grow may wait for company until its oldest request must go to
finish within the objective: the objective, less ``OBJECTIVE_MARGIN`` of it for what happens
outside the batch, less the predicted time of the batch it would join, less a margin for
what such plans recently overran by (``overrun.py``). The margin takes at most half the time
the batch has to spare: past that, shorter waits shrink the batches, which costs the event
loop more per request, which makes the overruns longer still. Uncapped, on two shared cores
at 80 % load, batches fell to 2-5 requests and the share within the objective to 0-19 %,
where half the objective as a fixed delay kept 43-94 % (``bench/NOTES.md``).

Waiting must also pay. Company saves a batch's fixed cost, which matters only while the
instances are short of time; otherwise the wait is latency for nothing. And a dispatch that
goes at once forms batches by itself as the instances fill up: requests queue behind the
batch that runs and go together in the next. So a batch waits only while, at the recent
arrival rate, batches of its size would keep the instances busy more than
``WAIT_WHEN_BUSIER_THAN`` of the time, near saturation; below that it goes at once, as with
no queue delay. Busy is judged by the CPU time of the thread that ran a CPU model's batches
(``Batcher._busy_times``): their wall time also counts the event loop and the client that
preempted that thread, and at 10x and 95 % load on two shared cores that made 3-9 % of the
batches wait where the model's own work kept its instance 12 % busy (``bench/NOTES.md``,
thirty-fifth round). On two cores with digits_cnn (a batch of one in tens of microseconds)
a queue delay of 0 had more goodput than the deferral at all three loads and both
objectives (seventeenth round); at half the instances' time as the bar, the rate's swings
crossed it at 80 and 95 % load, and the batches that then waited took the tail (eighteenth
round). A GPU model whose fixed cost dominates still defers.
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
WAIT_WHEN_BUSIER_THAN = 0.8
"""Share of the instances' time, at the arrival rate, above which batching pays a wait."""


class ArrivalRate:
    """Samples arriving per nanosecond: counted as they come (one addition a request, on a
    loop that may be the bottleneck), turned into a rate once ``WINDOW_NS`` has passed, and
    smoothed over windows (weight ``WEIGHT``: Poisson arrivals swing widely)."""

    WINDOW_NS = 5_000_000
    WEIGHT = 0.25

    def __init__(self) -> None:
        self.samples = 0
        """Samples counted since the window began."""
        self._start_ns: int | None = None
        self._per_ns: float | None = None

    def per_ns(self, now_ns: int) -> float | None:
        """The smoothed rate as of ``now_ns``; None until a first window has passed."""
        start = self._start_ns
        if start is None:  # the samples counted so far open the first window
            self._start_ns = now_ns
            return None
        elapsed = now_ns - start
        if elapsed >= self.WINDOW_NS:
            rate = self.samples / elapsed
            known = self._per_ns
            self._per_ns = rate if known is None else known + (rate - known) * self.WEIGHT
            self._start_ns, self.samples = now_ns, 0
        return self._per_ns


class ObjectivePlan:
    """One model version's latency objective: when its forming batch must go, when each
    started batch should finish, and what the plans overran by. Times are on the batcher's
    clock, in nanoseconds."""

    def __init__(self, objective_ns: int, stats: ModelStats) -> None:
        self.objective_ns = objective_ns
        self._stats = stats
        self._overrun = Overrun()
        self.rate = ArrivalRate()
        """The batcher counts each request's samples in; ``waiting_pays`` reads it."""
        self._go_ns: int | None = None
        """When the plan had the batch being formed go, so that a wake-up that fired late
        counts as overrun; None while no plan was made for it."""

    def waiting_pays(self, now_ns: int, samples: int, predicted_ns: int, instances: int) -> bool:
        """Whether batches of ``samples`` (predicted at ``predicted_ns``) would keep the
        ``instances`` busier than ``WAIT_WHEN_BUSIER_THAN`` at the recent arrival rate; yes
        while the rate is unknown."""
        rate = self.rate.per_ns(now_ns)
        if rate is None:
            return True
        return rate * predicted_ns / max(1, samples) / max(1, instances) > WAIT_WHEN_BUSIER_THAN

    def queue_emptied(self) -> None:
        """The queue ran empty: no batch is being formed, nothing is planned."""
        self._go_ns = None

    def due(self, oldest_ns: int, predicted_ns: int) -> int:
        """The latest the batch may go for its oldest request (queued at ``oldest_ns``) to
        finish within the objective, ``predicted_ns`` being the time of the batch it would
        join, keeping free what plans recently overran by, up to half the time to spare."""
        spare = int(self.objective_ns * (1 - OBJECTIVE_MARGIN)) - predicted_ns
        self._go_ns = oldest_ns + spare - min(self._overrun.margin_ns, max(0, spare) // 2)
        return self._go_ns

    def started(self, batch: list[WorkItem], now_ns: int, predicted_ns: int) -> None:
        """``batch`` went at ``now_ns``: if a plan was made for it, it should finish
        ``predicted_ns`` after it, or after its due time when that was earlier (a late
        wake-up is the plan's overrun too). A batch that went at once because waiting did
        not pay had no plan and teaches no margin (its requests would cost the loop the
        bookkeeping; the margin is learned again within ``overrun.REFRESH`` answers once waiting
        pays)."""
        if self._go_ns is None:
            self._stats.objective_direct += 1
            return
        self._stats.objective_planned += 1
        planned = min(now_ns, self._go_ns)
        self._go_ns = None  # the next batch is planned afresh, if it waits
        for item in batch:
            item.planned_finish_ns = planned + predicted_ns

    def answered(self, item: WorkItem, answered_ns: int, count: int = 1) -> None:
        """``item``'s response was ready at ``answered_ns`` for ``count`` requests: how far
        past its batch's planned finish teaches the margin."""
        if item.planned_finish_ns:
            self._overrun.record(answered_ns - item.planned_finish_ns, count)
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
