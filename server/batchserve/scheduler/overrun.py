"""How much later than planned the objective-driven dispatch's requests were answered.

A waiting batch's plan (``batcher.py``) is to go at its due time and run for the predicted
batch time. What the plan does not see comes on top: a wake-up that fires late because the
event loop was busy, a batch slower than predicted, the loop's delay in taking a finished
batch back, and building each response, one request after another. On two shared cores at
80 % load these took the dispatch's median past a 5.5 ms objective with every batch planned
to finish within it (``bench/OBJECTIVE.md``, the fourteenth round of ``bench/NOTES.md``).
So each answered request's overrun (answered time minus planned finish) is kept over the
last ``WINDOW`` answers, and the plan keeps the ``QUANTILE`` of them free.
"""

from __future__ import annotations

WINDOW = 256
"""Answers the margin is taken over: tens of milliseconds under load, so that it follows
the machine as other work comes and goes on its cores."""
QUANTILE = 0.95
"""Overruns the margin covers: the oldest request of a batch meets its objective this often,
its younger companions (with more of the objective left) more often."""
REFRESH = 32
"""Answers between two computations of the margin (a sort of ``WINDOW`` integers)."""


class Overrun:
    """The recent overruns of one model version's plans, and the margin they call for."""

    def __init__(self) -> None:
        self._recent = [0] * WINDOW
        self._count = 0
        self._margin_ns = 0

    @property
    def margin_ns(self) -> int:
        """What the plan keeps free: the ``QUANTILE`` of recent overruns, at least 0 (0 until
        ``REFRESH`` answers were measured)."""
        return self._margin_ns

    def record(self, overrun_ns: int, count: int = 1) -> None:
        """``count`` requests (a worker's group: one timing) were answered ``overrun_ns``
        after their planned finish (negative: before)."""
        before = self._count
        if count == 1:  # one request (the common case, once an answer)
            self._recent[before % WINDOW] = overrun_ns
        else:
            for index in range(before, before + min(count, WINDOW)):
                self._recent[index % WINDOW] = overrun_ns
        self._count += count
        if self._count // REFRESH > before // REFRESH:
            measured = sorted(self._recent[: min(self._count, WINDOW)])
            self._margin_ns = max(0, measured[int(QUANTILE * (len(measured) - 1))])
