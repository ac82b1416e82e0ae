"""Length-bucketed batching: which queued requests of a sequence model run together.

A batch is padded to its longest request. Requests of very different lengths in one batch
waste compute on padding; many small batches waste what each step of a batch costs
whatever its rows. A batch of R rows padded to L steps is estimated at
``L * (R + step_cost_rows)`` plus a cost of its own (learned): with the candidates in order
of length, the cut into runs (each within the batch cap) of least total estimate is found
by dynamic programming, and
the run holding the queue's head goes now. The others wait for the next free instance,
where the cut is made again with whatever arrived meanwhile; the head always goes first,
so no length starves.

``step_cost_rows`` is the config's, or learned from the model's own batches (``StepCost``):
about one row on a CPU, where a step's time grows with its rows, and many on a GPU, where
a step costs about the same whatever its rows and batches should stay whole.

A grouped batch waits for company under the queue delay's own rules, as any batch does:
the more lengths are queued, the closer the lengths the cut can put together. (Letting it go
once as many requests were queued as were still out bought no throughput measured on the
real server, char_lstm at c=32 on 2 cores, and left 16 % of the computed elements padding
rather than 12.5 %.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Lengthed(Protocol):
    """What the cut reads of a queued request."""

    @property
    def row_positions(self) -> int: ...

    @property
    def batch_size(self) -> int: ...


Item = TypeVar("Item", bound=Lengthed)

LOOKAHEAD = 4
"""How many batches' worth of queued requests grouping looks through."""
CANDIDATES = 64
"""The head and the queued requests closest to it in length that one cut considers (the
cut is quadratic in them)."""
LEARN_AFTER = 16
"""Batches measured, of sizes and lengths that tell the costs apart, before the learned
step cost replaces the device's default."""
WHOLE = 1e9
"""The step cost, in rows, of a model whose rows cost nothing measurable: no cut pays."""
NEGLIGIBLE = 0.01
"""Rows whose share of the measured time is below this cost nothing measurable."""
DECAY = 0.99
"""Weight each older batch keeps per newer one: the fit follows a changing machine."""
REFERENCE_NS = 1_000_000
"""Scale of the fit's weights (a batch of this time weighs 1); any would do."""
INDEPENDENT = 1e-9
"""Least scaled determinant of the fit's normal equations for the sizes and lengths measured
to tell a step's cost from a row's and the batch's own."""


def closest_first(head: Item, window: Sequence[Item]) -> list[Item]:
    """The window ordered by how far each length is from the head's (queue order on ties)."""
    target = head.row_positions
    return sorted(window, key=lambda item: abs(item.row_positions - target))


def head_run(
    head: Item,
    candidates: Sequence[Item],
    cap: int,
    step_cost_rows: float,
    batch_cost: float = 0,
    most_steps: int = 0,
) -> list[Item]:
    """The head and the candidates that share its run in the cheapest cut (head first)."""
    ordered = sorted([head, *candidates], key=lambda item: item.row_positions)
    for run in cheapest_cut(ordered, cap, step_cost_rows, batch_cost, most_steps):
        if any(item is head for item in run):
            return [head, *(item for item in run if item is not head)]
    raise AssertionError("every item is in one run of the cut")  # pragma: no cover


def cheapest_cut(
    ordered: Sequence[Item],
    cap: int,
    step_cost_rows: float,
    batch_cost: float = 0,
    most_steps: int = 0,
) -> list[list[Item]]:
    """``ordered`` (by length) cut into runs of at most ``cap`` rows and, where
    ``most_steps`` is set, at most that many row-steps padded (the memory budget's), least
    estimate first found; ``batch_cost`` (row-steps) is added once per run. Runs are
    contiguous: in an optimal cut, no run's lengths interleave another's. An item over
    either bound runs alone."""
    count = len(ordered)
    sizes = [item.batch_size for item in ordered]  # a plain list: this runs on the event loop
    best = [0.0] * (count + 1)  # best[j]: cheapest cut of the first j items
    start = [0] * (count + 1)
    for end in range(1, count + 1):
        length = ordered[end - 1].row_positions  # the longest of any run ending here
        own = batch_cost + length * step_cost_rows
        rows, cheapest, cheapest_start = 0, float("inf"), 0
        most_rows = min(cap, most_steps // length) if most_steps and length else cap
        for first in range(end - 1, -1, -1):  # the run is ordered[first:end]
            rows += sizes[first]
            if rows > most_rows and first < end - 1:
                break
            cost = best[first] + own + length * rows
            if cost < cheapest:
                cheapest, cheapest_start = cost, first
        best[end], start[end] = cheapest, cheapest_start
    runs = []
    end = count
    while end:
        runs.append(list(ordered[start[end] : end]))
        end = start[end]
    return runs[::-1]


class StepCost:
    """What a batch costs beyond its row-steps, from the model's measured batches: the time
    of a batch of R rows padded to L steps, fitted as ``c + L * (a + b * R)`` by least
    squares over recent batches, gives a step's own cost ``a / b`` in rows and the batch's
    ``c / b`` in row-steps (the hand-over to the instance, copies, the call itself)."""

    def __init__(self, configured: float, default: float) -> None:
        self._configured = configured
        self._default = default
        self._gram = [[0.0] * 3 for _ in range(3)]  # decayed sums of x x^T, x = (1, L, L * R)
        self._moment = [0.0] * 3  # decayed sums of x * ns
        self._measured = 0
        self._fit: tuple[float, float] | None = None
        self._stale = False

    @property
    def rows(self) -> float:
        """A step's own cost in rows: as configured, else learned, else the default."""
        if self._configured:
            return self._configured
        fit = self._fitted()
        return self._default if fit is None else fit[0]

    @property
    def batch_row_steps(self) -> float:
        """A batch's own cost in row-steps: learned, else 0 (none is configured)."""
        fit = None if self._configured else self._fitted()
        return 0.0 if fit is None else fit[1]

    def record(self, rows: int, steps: int, ns: int) -> None:
        """One batch of ``rows`` padded to ``steps`` took ``ns`` on the instance.

        The fit weighs each batch by ``1 / ns**2`` (least relative error): on a busy machine a
        long batch's time varies by milliseconds, which would otherwise swamp the short
        batches that tell a step's own cost (unweighted, a 2-core machine shared with other
        work read char_lstm's step as 0 rows, and the cut then ran nearly every request
        alone, where a row-step costs twice what it does in a batch of 8). Plain floats, not
        numpy: this runs on the event loop once a batch, where numpy's 3x3 solve and
        condition number cost ~70 us (~15 us a request at char_lstm's batches of 4-5)."""
        if self._configured or steps <= 0 or rows <= 0 or ns <= 0:
            return
        x = (1.0, float(steps), float(steps * rows))
        weight = (REFERENCE_NS / ns) ** 2
        for i, row in enumerate(self._gram):
            for j in range(3):
                row[j] = row[j] * DECAY + weight * x[i] * x[j]
            self._moment[i] = self._moment[i] * DECAY + weight * x[i] * ns
        self._measured += 1
        self._stale = True

    def _fitted(self) -> tuple[float, float] | None:
        if self._measured < LEARN_AFTER:
            return None
        if self._stale:
            self._stale = False
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float] | None:
        solved = solve_normal(self._gram, self._moment)
        if solved is None:  # too few sizes and lengths to tell apart
            return None
        per_batch, per_step, per_row_step = solved
        total = self._moment[0]  # decayed, weighted sum of measured times
        explained_by_rows = per_row_step * self._gram[0][2]
        if explained_by_rows <= NEGLIGIBLE * total:  # rows cost nothing measurable
            return WHOLE, 0.0
        return (
            min(WHOLE, max(0.0, per_step / per_row_step)),
            max(0.0, per_batch / per_row_step),
        )


def solve_normal(gram: list[list[float]], moment: list[float]) -> tuple[float, ...] | None:
    """The least-squares coefficients from 3x3 normal equations (Cramer's rule), or None
    when the measured points cannot tell them apart: the determinant of the gram scaled to
    a unit diagonal (1 for independent terms, 0 for dependent ones) is below
    ``INDEPENDENT``."""
    det = _det3(gram)
    scale = gram[0][0] * gram[1][1] * gram[2][2]
    if scale <= 0 or det / scale < INDEPENDENT:
        return None
    return tuple(
        _det3([[moment[r] if c == k else gram[r][c] for c in range(3)] for r in range(3)]) / det
        for k in range(3)
    )


def _det3(m: list[list[float]]) -> float:
    return (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )
