"""A decoupled request's replies, counted into Triton's response statistics as they go.

Triton counts the N-th response of every request (``response_stats``): the time to compute
it, since the request's compute began or the previous response was written, and the time
to write it; an empty response (no outputs, a final flag) its compute time only; a request
cancelled or failed at its N-th response, the time until then.
"""

from __future__ import annotations

import asyncio
import time

from batchserve.observability.stats import ModelStats


class ReplyCounts:
    """The replies of one request so far; ``first_ns`` when its first one was written."""

    __slots__ = ("_last", "_stats", "first_ns", "index")

    def __init__(self, stats: ModelStats, began_ns: int) -> None:
        self._stats = stats
        self._last = began_ns
        self.index = 0
        self.first_ns: int | None = None

    def empty(self) -> None:
        """A reply without outputs (a final flag), whether or not the client asked for it."""
        now = time.monotonic_ns()
        self._stats.record_response(self.index, "empty", now - self._last)
        self._next(now)

    def written(self, ready_ns: int) -> None:
        """A reply computed at ``ready_ns`` whose response is now written."""
        now = time.monotonic_ns()
        self._stats.record_response(self.index, "success", ready_ns - self._last, now - ready_ns)
        if self.first_ns is None:
            self.first_ns = now
        self._next(now)

    def ended(self, error: BaseException) -> None:
        """The request stopped at its next reply: cancelled (or its stream closed under
        it), or failed."""
        gone = isinstance(error, (asyncio.CancelledError, GeneratorExit))
        outcome = "cancel" if gone else "fail"
        self._stats.record_response(self.index, outcome, time.monotonic_ns() - self._last)

    def _next(self, now: int) -> None:
        self.index += 1
        self._last = now
