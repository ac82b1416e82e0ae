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


class ArrivalGaps:
    """Exponentially weighted mean gap between arrivals (weight 1/8, as TCP's smoothed RTT).

    With no two arrivals seen yet the expected gap is infinite: an idle model has no
    reason to believe company is coming.
    """

    WEIGHT = 0.125

    def __init__(self) -> None:
        self._last_ns: int | None = None
        self._mean_ns = math.inf

    def record(self, now_ns: int) -> None:
        if self._last_ns is not None:
            gap = now_ns - self._last_ns
            mean = self._mean_ns
            self._mean_ns = gap if mean == math.inf else mean + (gap - mean) * self.WEIGHT
        self._last_ns = now_ns

    def expected_gap_ns(self) -> float:
        return self._mean_ns
