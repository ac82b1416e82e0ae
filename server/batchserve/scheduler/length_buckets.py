"""Length-bucketed batching: which queued requests of a sequence model run together.

A batch is padded to its longest request. Requests of very different lengths in one batch
waste compute on padding; many small batches waste what each step of a batch costs
whatever its rows. A batch of R rows padded to L steps is estimated at
``L * (R + step_cost_rows)``: with the candidates in order of length, the cut into runs
(each within the batch cap) of least total estimate is found by dynamic programming, and
the run holding the queue's head goes now. The others wait for the next free instance,
where the cut is made again with whatever arrived meanwhile; the head always goes first,
so no length starves.

``step_cost_rows`` is the config's, or learned from the model's own batches (``StepCost``):
about one row on a CPU, where a step's time grows with its rows, and many on a GPU, where
a step costs about the same whatever its rows and batches should stay whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Lengthed(Protocol):
    """What the cut reads of a queued request."""

    @property
    def sequence_length(self) -> int: ...

    @property
    def batch_size(self) -> int: ...


Item = TypeVar("Item", bound=Lengthed)

LOOKAHEAD = 4
"""How many batches' worth of queued requests grouping looks through."""
CANDIDATES = 64
"""The head and the queued requests closest to it in length that one cut considers (the
cut is quadratic in them)."""
LEARN_AFTER = 16
"""Batches measured, at two or more sizes, before the learned step cost replaces the
device's default."""
WHOLE = 1e9
"""The step cost, in rows, of a model whose rows cost nothing measurable: no cut pays."""
NEGLIGIBLE = 0.01
"""Rows whose share of a step's measured time is below this cost nothing measurable."""
DECAY = 0.99
"""Weight each older batch keeps per newer one: the fit follows a changing machine."""


def closest_first(head: Item, window: Sequence[Item]) -> list[Item]:
    """The window ordered by how far each length is from the head's (queue order on ties)."""
    target = head.sequence_length
    return sorted(window, key=lambda item: abs(item.sequence_length - target))


def head_run(head: Item, candidates: Sequence[Item], cap: int, step_cost_rows: float) -> list[Item]:
    """The head and the candidates that share its run in the cheapest cut (head first)."""
    ordered = sorted([head, *candidates], key=lambda item: item.sequence_length)
    for run in cheapest_cut(ordered, cap, step_cost_rows):
        if any(item is head for item in run):
            return [head, *(item for item in run if item is not head)]
    raise AssertionError("every item is in one run of the cut")  # pragma: no cover


def cheapest_cut(ordered: Sequence[Item], cap: int, step_cost_rows: float) -> list[list[Item]]:
    """``ordered`` (by length) cut into runs of at most ``cap`` rows, least estimate first
    found. Runs are contiguous: in an optimal cut, no run's lengths interleave another's."""
    count = len(ordered)
    best = [0.0] + [float("inf")] * count  # best[j]: cheapest cut of the first j items
    start = [0] * (count + 1)
    for end in range(1, count + 1):
        length = ordered[end - 1].sequence_length  # the longest of any run ending here
        rows = 0
        for first in range(end, 0, -1):
            rows += ordered[first - 1].batch_size
            if rows > cap and first < end:
                break
            cost = best[first - 1] + length * (rows + step_cost_rows)
            if cost < best[end]:
                best[end], start[end] = cost, first - 1
    runs = []
    end = count
    while end:
        runs.append(list(ordered[start[end] : end]))
        end = start[end]
    return runs[::-1]


class StepCost:
    """A step's own cost in rows, from the model's measured batches: the time per step,
    fitted as ``a + b * rows`` by least squares over recent batches, gives ``a / b``."""

    def __init__(self, configured: float, default: float) -> None:
        self._configured = configured
        self._default = default
        self._sums = [0.0] * 5  # weight, x, y, xx, xy; x = rows, y = ns per step
        self._measured = 0
        self._sizes: set[int] = set()

    @property
    def rows(self) -> float:
        """The configured value, else the learned one once learned, else the default."""
        if self._configured:
            return self._configured
        learned = self._fitted()
        return self._default if learned is None else learned

    def record(self, rows: int, steps: int, ns: int) -> None:
        """One batch of ``rows`` padded to ``steps`` took ``ns`` on the instance."""
        if self._configured or steps <= 0 or rows <= 0:
            return
        x, y = float(rows), ns / steps
        sums = [value * DECAY for value in self._sums]
        for index, term in enumerate((1.0, x, y, x * x, x * y)):
            sums[index] += term
        self._sums = sums
        self._measured += 1
        if len(self._sizes) < 2:
            self._sizes.add(rows)

    def _fitted(self) -> float | None:
        if self._measured < LEARN_AFTER or len(self._sizes) < 2:
            return None
        weight, x, y, xx, xy = self._sums
        spread = weight * xx - x * x
        if spread <= 0:
            return None
        per_row = (weight * xy - x * y) / spread
        per_step = (y - per_row * x) / weight
        if per_row * x <= NEGLIGIBLE * y:  # rows cost nothing measurable: keep batches whole
            return WHOLE
        return min(WHOLE, max(0.0, per_step / per_row))
