"""When a batch that could still grow should stop waiting for company (``max_queue_delay``).

The batcher asks only when the queue has not reached a preferred size and the batch could
still grow; the answer is to go at once or to look again at a given time. A waiting batch
goes:
- at the latest once its oldest request has waited ``max_queue_delay``;
- at once when, by the measured arrival gap (``timing.ArrivalGaps``), no other request can
  come before that delay is out, so that a lone client is never delayed once that is
  learned;
- as soon as every client answered has asked again, those overdue included (closed-loop
  clients are then all waiting, nobody else is coming);
- when no answered client is still expected, once arrivals have stopped for ``QUIET_GAPS``
  expected gaps: the burst that was filling the batch has ended.
A request that waited and went alone teaches that company comes more rarely than
expected (``ArrivalGaps.lonely``).

Triton waits the whole delay instead, whatever comes; ``wait_out`` (the config's
``batchserve { wait_out_queue_delay }`` or the server's ``--wait-out-queue-delay``) does
the same, for models whose answers depend on which requests shared their batch, or for
comparisons with Triton's batch statistics.

Answered clients not back when a batch goes without them are no longer waited for, but
not forgotten either (``overdue``): on a busy machine they are late, not gone (the server's
loop, or theirs, was off the CPU), and when they come back they must not pass for the
clients answered since. Forgotten, two answered would be "all back" as soon as any two
requests came, whoever sent them, and so every batch size repeats itself: one stall held 32
closed-loop clients in batches of one or two for seconds. Each batch that goes without them
takes half of those still missing as gone, so clients that left stop counting within a few
batches.
"""

from __future__ import annotations

from batchserve.scheduler.timing import ArrivalGaps

QUIET_GAPS = 2
"""Expected gaps without an arrival after which a waiting batch stops waiting: the requests
that were coming have come (with closed-loop clients, every client is now waiting)."""


class DispatchTiming:
    """The waiting rules of one model version with a ``max_queue_delay``, and what they
    learn from its traffic. Times are on the batcher's clock, in nanoseconds."""

    def __init__(self, delay_ns: int, wait_out: bool = False) -> None:
        self.delay_ns = delay_ns
        self.wait_out = wait_out
        """Wait the whole delay, as Triton does: none of the rules that end it sooner."""
        self.gaps = ArrivalGaps()
        self.returning = 0
        """Requests answered and not yet matched by a new arrival: with closed-loop clients,
        clients about to ask again. While some are, a pause in arrivals is the server
        sending answers (gRPC sends them one per loop pass), not a sign that all clients
        are waiting; once the last is back, they all are."""
        self.overdue = 0
        """Answered clients not back when a batch went without them: not waited for, but
        all are back only once they are too (or once halved away, one halving at each batch
        that goes without them)."""
        self._all_back = False
        """The last answered client has asked again; holds until the queue next empties or
        more are answered."""
        self._made_to_wait = False
        """The last decision was to wait: if the head then goes alone, nobody came."""

    def arrived(self, now_ns: int, joined: bool, new_pass: bool, clients: int = 1) -> None:
        """A request was queued at ``now_ns``; ``joined``: others were queued already;
        ``new_pass``: the first of its event-loop pass (requests decoded in one pass came
        together, so they count as one arrival for the gap, each as one returning client);
        ``clients``: the requests it carries (a worker's group carries several, and the
        clients of one answered batch may come back grouped differently)."""
        if self.returning or self.overdue:
            back = min(self.returning, clients)  # the latest answered first: they are waited for
            self.returning -= back
            self.overdue = max(0, self.overdue - (clients - back))
            if not self.returning and not self.overdue:
                self._all_back = True
        if new_pass:
            self.gaps.arrival(now_ns, joined=joined)
        elif joined:
            self.gaps.together()

    def answered(self, requests: int) -> None:
        """``requests`` were answered: their clients may ask again, so not all are back (a
        batch running when the last came back would otherwise leave the next one behind
        alone, and split the clients into two groups that each repeat themselves)."""
        self.returning += requests
        self._all_back = False

    def went_ready(self) -> None:
        """A batch went because it reached a preferred size or could not grow: it was not
        kept waiting by these rules."""
        self._made_to_wait = False

    def emptied(self) -> None:
        """The queue ran empty: those who were all back have gone, whichever rule sent them."""
        self._all_back = False

    def wait_until(
        self, now_ns: int, oldest_ns: int, queued: int, objective_due_ns: int | None = None
    ) -> int | None:
        """None to go now; otherwise the time to look again, if nothing else happens first.

        ``oldest_ns``: when the longest-waiting of the ``queued`` requests arrived;
        ``objective_due_ns``: the latest the batch may go for that request to meet its
        latency objective, which replaces the queue delay (or comes first, with both set).
        """
        if self.wait_out:
            return self._waited_out(now_ns, oldest_ns, objective_due_ns)
        if self._all_back:  # every client answered has asked again: nobody else is coming
            self._go(now_ns, oldest_ns, queued)
            return None
        due = self._due(oldest_ns, objective_due_ns)
        gaps = self.gaps
        gap = gaps.expected_gap_ns()
        if now_ns + gap > due:  # the delay is out, or nobody is expected before it is
            self._go_without_all(now_ns, oldest_ns, queued)
            return None
        last = gaps.last_ns
        assert last is not None  # a finite gap was measured between arrivals
        quiet = last + QUIET_GAPS * gap
        if now_ns >= quiet:
            if not self.returning:  # the burst that was filling the batch has ended
                self._go_without_all(now_ns, oldest_ns, queued)
                return None
            quiet = due  # answered clients are still to come: only they or the delay end it
        wake = min(due, int(quiet))
        if wake <= now_ns:  # never a wake-up already past: it would fire again at once
            self._go_without_all(now_ns, oldest_ns, queued)
            return None
        self._made_to_wait = True
        return wake

    def fresh(self) -> DispatchTiming:
        """The same rules, having learned nothing yet."""
        return DispatchTiming(self.delay_ns, self.wait_out)

    def _waited_out(self, now_ns: int, oldest_ns: int, objective_due_ns: int | None) -> int | None:
        """Triton's rule: go once the oldest request has waited the delay (or its objective
        allows no more)."""
        due = self._due(oldest_ns, objective_due_ns)
        return None if now_ns >= due else due

    def _due(self, oldest_ns: int, objective_due_ns: int | None) -> int:
        """The latest the batch may go: the delay after its oldest request, or what the
        objective allows, whichever is sooner."""
        due = oldest_ns + self.delay_ns
        if objective_due_ns is not None:
            due = min(due, objective_due_ns) if self.delay_ns else objective_due_ns
        return due

    def _go(self, now_ns: int, oldest_ns: int, queued: int) -> None:
        """The batch goes now; a request that was kept waiting and goes alone teaches."""
        if self._made_to_wait and queued == 1:
            self.gaps.lonely(now_ns - oldest_ns)  # it waited, and nobody came
        self._made_to_wait = False

    def _go_without_all(self, now_ns: int, oldest_ns: int, queued: int) -> None:
        """The batch goes before every answered client is back: those not back by now are
        no longer waited for, and half of those already overdue are taken as gone."""
        self._go(now_ns, oldest_ns, queued)
        self.overdue = self.overdue // 2 + self.returning
        self.returning = 0
