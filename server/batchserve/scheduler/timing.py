"""How the batcher observes time: a monotonic clock, a wake-up timer, the arrival rate.

Both the clock and the timer are injected, so tests drive ``max_queue_delay`` with a
hand-advanced clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

Clock = Callable[[], int]
"""Monotonic time in nanoseconds."""


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    """Calls back at a time of the batcher's clock."""

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle: ...


class LoopTimer:
    """The event loop's timer, translating a clock time into a delay from now."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        delay = max(0.0, (when_ns - self._clock()) / 1e9)
        return asyncio.get_running_loop().call_later(delay, callback)


class WakeUp:
    """At most one pending call-back, at the earliest time asked for: a later request
    would only look again after an earlier one has looked anyway."""

    def __init__(self, timer: Timer, callback: Callable[[], None]) -> None:
        self._timer = timer
        self._callback = callback
        self._handle: TimerHandle | None = None
        self._due_ns = 0

    def at(self, due_ns: int) -> None:
        """Call back at ``due_ns``, unless a call-back no later than that is pending."""
        if self._handle is not None:
            if self._due_ns <= due_ns:
                return
            self._handle.cancel()
        self._due_ns = due_ns
        self._handle = self._timer.call_at(due_ns, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()


class ArrivalGaps:
    """How soon a queued request gets company: the smoothed gap (weight 1/8, as TCP's
    smoothed RTT) between arrivals that found other requests already queued.

    Only such arrivals count. With closed-loop clients (each waits for its answer before
    asking again) a lone client's requests never meet another, so however often it asks
    nobody is expected, and it never waits; under concurrent load they meet all the time.
    A request that waited without company is a censored observation (the gap is longer
    than its wait), recorded as ``LONELY_FACTOR`` times the wait, so a model whose load has
    gone stops waiting after some such requests (each multiplies the estimate by about
    1.4 when the batcher waits two expected gaps). A larger factor forgets a busy spell
    sooner but also takes the last stragglers of a burst for a sign that load has gone.
    Until some company has been seen the expected gap is infinite.

    A gap between arrivals counts for at most ``CLIP`` times the estimate: when the machine
    is busy the server's loop can be off the CPU for hundreds of milliseconds, and the
    arrivals it then finds waiting seem to have come after one long gap; taken whole, one
    such gap made every batch go alone for seconds ("nobody is expected within the delay").
    A real slow-down still raises the estimate by ~1.4 per arrival, and lonely requests
    (the batcher's own waits, not clipped) teach it too.

    Requests decoded in one event-loop pass are one arrival. When batches run on the loop
    itself, each is answered before the next pass, so a second request in one pass may be
    the only company ever seen: it shows that company comes within one pass gap (``together``).
    """

    WEIGHT = 0.125
    LONELY_FACTOR = 2
    CLIP = 4

    def __init__(self) -> None:
        self.last_ns: int | None = None
        self._previous_ns: int | None = None
        self._pass_counted = False
        self._mean_ns = math.inf

    def arrival(self, now_ns: int, *, joined: bool) -> None:
        """A request arrived, the first of its pass; ``joined``: others were queued when it
        did."""
        if self.last_ns is not None:
            now_ns = max(now_ns, self.last_ns)  # a gap is never negative (a mean below 0
            # would make every wait end before it began, and the batcher spin)
            if joined:
                self._observe(min(now_ns - self.last_ns, self.CLIP * self._mean_ns))
        self._pass_counted = joined
        self._previous_ns, self.last_ns = self.last_ns, now_ns

    def together(self) -> None:
        """Another request came in the pass of the last arrival, which found none queued:
        company came at most one pass gap after the arrival before. Observed only when that
        is sooner than expected, once per pass (the gap inside a pass is no gap)."""
        if self._pass_counted or self.last_ns is None or self._previous_ns is None:
            return
        self._pass_counted = True
        gap = self.last_ns - self._previous_ns
        if gap < self._mean_ns:
            self._observe(gap)

    def lonely(self, waited_ns: int) -> None:
        """A request waited ``waited_ns`` and nobody came."""
        self._observe(self.LONELY_FACTOR * max(waited_ns, 1))

    def _observe(self, gap_ns: float) -> None:
        mean = self._mean_ns
        self._mean_ns = gap_ns if mean == math.inf else mean + (gap_ns - mean) * self.WEIGHT

    def expected_gap_ns(self) -> float:
        return self._mean_ns
