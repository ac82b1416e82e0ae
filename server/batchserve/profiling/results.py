"""What a sweep measured, the table it prints, and the setting it recommends.

The recommendation is Model Analyzer's online objective under a latency budget: the highest
throughput whose p99 latency is within the budget. Throughputs within ``TIE_PERCENT`` of the
best are a tie, less than one measurement's noise, or within the noise the sweep itself
measured where that is more (``Repeat``): the tie goes to the config as it is, so that
a rewrite buys more than noise, else to the lowest p99.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchserve.profiling.perf_analyzer import Measurement
from batchserve.profiling.plan import Setting

BUDGET_FACTOR = 1.25
"""With no --latency-budget, the p99 budget is this many times the p99 of the config as it is
at the same load: no worse a tail than now, give or take measurement noise. Two measurements
of one setting in --quick's windows differ in p99 by some 10-15 % on a lightly loaded 2-core
machine, so a budget of exactly the p99 would fail the config as it is half the time; a
quarter more keeps it a candidate while a setting clearly slower in the tail still fails. A
machine busy with other work upsets the p99 far more than any factor absorbs: measure there
with longer --measurement-interval windows."""
TIE_PERCENT = 2.0
"""The least margin of a tie: two back-to-back measurements of one setting on a quiet
machine. A sweep that measured more noise widens it (``Repeat``)."""

_HEADERS = ("Instances", "Max Batch Size", "Queue Delay (us)", "Concurrency",
            "Throughput (infer/sec)", "p50 (ms)", "p95 (ms)", "p99 (ms)", "Avg Batch",
            "Satisfies Constraints")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    """One row: a setting measured at one concurrency, or why it could not be.

    Args:
        concurrency: perf_analyzer's clients; 0 for a setting the server refused.
        problem: why there is no measurement (the server refused the setting, or
            perf_analyzer failed), empty when measured.
        batch_cap: the largest batch the memory budget left, when below max_batch_size.
    """

    setting: Setting
    concurrency: int
    measurement: Measurement | None = None
    average_batch: float | None = None
    batch_cap: int | None = None
    problem: str = ""

    def meets(self, budget_ms: float) -> bool:
        return self.measurement is not None and self.measurement.p99_ms <= budget_ms


def default_budget(as_it_is: Measurement) -> float:
    """The p99 budget in ms when none is given, from the config as it is at the sweep's load."""
    return BUDGET_FACTOR * as_it_is.p99_ms


@dataclass(frozen=True, slots=True)
class Repeat:
    """The config as it is, measured first and again among the settings at the same clients:
    how far the machine alone moved its figures during the sweep. On the 2-core reference VM
    `--quick` put char_lstm's at 1,708 and 909 infer/sec in one sweep and 1,863 and 1,184 in
    the next, and recommended a different setting each time, neither better than the first
    figure by more than that spread; in a third, the second p99 missed the budget the first
    set, and a setting 0.1 % faster than the first figure was written."""

    first: Measurement
    again: Measurement

    @property
    def noise_percent(self) -> float:
        """The two throughputs' distance in per cent of the larger."""
        one, two = self.first.throughput, self.again.throughput
        larger = max(one, two)
        return 100 * abs(one - two) / larger if larger > 0 else 0.0

    @property
    def best_throughput(self) -> float:
        return max(self.first.throughput, self.again.throughput)

    def meets(self, budget_ms: float) -> bool:
        """Whether either measurement's p99 was within the budget."""
        return min(self.first.p99_ms, self.again.p99_ms) <= budget_ms


def choose(
    outcomes: Sequence[Outcome],
    budget_ms: float,
    current: Setting | None = None,
    repeat: Repeat | None = None,
) -> Outcome | None:
    """The best row within the budget, ``current`` winning a tie; None when no row is. With
    ``repeat``, the current setting is judged by the better of its two measurements (within
    the budget if either was, tying at the higher throughput), and the tie's margin widens
    to the noise they show: a rewrite must beat the config as it is by more than the noise."""

    def repeated(outcome: Outcome) -> Repeat | None:
        """``repeat`` for the current setting's row at the clients it was measured at first."""
        if repeat is None or outcome.setting != current:
            return None
        return repeat if outcome.concurrency == repeat.first.concurrency else None

    def within(outcome: Outcome) -> bool:
        again = repeated(outcome)
        return outcome.meets(budget_ms) or (again is not None and again.meets(budget_ms))

    def figure(outcome: Outcome) -> float:
        again = repeated(outcome)
        return max(_throughput(outcome), again.best_throughput if again else 0.0)

    passing = [o for o in outcomes if o.measurement is not None and within(o)]
    if not passing:
        return None
    margin = max(TIE_PERCENT, repeat.noise_percent) if repeat is not None else TIE_PERCENT
    floor = max(figure(o) for o in passing) * (1 - margin / 100)
    tied = [o for o in passing if figure(o) >= floor]
    return min(tied, key=lambda o: (o.setting != current, _p99(o), -_throughput(o)))


def table(outcomes: Sequence[Outcome], budget_ms: float, chosen: Outcome | None) -> str:
    """An aligned text table, one row per outcome, the chosen one marked with ``*``."""
    rows = [list(_HEADERS)] + [_cells(o, budget_ms, o is chosen) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def notes(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per row that needs a word: refused, failed, unstable or capped."""
    lines = []
    for outcome in outcomes:
        where = outcome.setting.label
        if outcome.concurrency:
            where += f", concurrency {outcome.concurrency}"
        if outcome.problem:
            lines.append(f"{where}: {outcome.problem.splitlines()[0]}")
            continue
        if outcome.measurement is not None and not outcome.measurement.stable:
            lines.append(f"{where}: unstable (windows disagreed by more than the stability asked)")
        if outcome.batch_cap is not None:
            lines.append(f"{where}: the memory budget caps batches at {outcome.batch_cap}")
    return lines


def _cells(outcome: Outcome, budget_ms: float, chosen: bool) -> list[str]:
    setting, measured = outcome.setting, outcome.measurement
    delay = "-" if setting.queue_delay_us is None else str(setting.queue_delay_us)
    head = [str(setting.instances), str(setting.max_batch_size), delay,
            str(outcome.concurrency or "-")]  # fmt: skip
    if measured is None:
        verdict = "refused" if outcome.problem.startswith("refused") else "failed"
        return [*head, "-", "-", "-", "-", "-", verdict]
    batch = "-" if outcome.average_batch is None else f"{outcome.average_batch:.1f}"
    verdict = ("yes" if outcome.meets(budget_ms) else "no") + (" *" if chosen else "")
    return [*head, f"{measured.throughput:.1f}", f"{measured.p50_ms:.2f}",
            f"{measured.p95_ms:.2f}", f"{measured.p99_ms:.2f}", batch, verdict]  # fmt: skip


def _throughput(outcome: Outcome) -> float:
    return outcome.measurement.throughput if outcome.measurement is not None else 0.0


def _p99(outcome: Outcome) -> float:
    return outcome.measurement.p99_ms if outcome.measurement is not None else float("inf")
