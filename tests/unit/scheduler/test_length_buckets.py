"""The cheapest cut by length, and the step cost learned from measured batches."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from batchserve.scheduler.length_buckets import (
    LEARN_AFTER,
    WHOLE,
    StepCost,
    cheapest_cut,
    head_run,
    solve_normal,
)


@dataclass(eq=False)
class Item:
    """What the cut reads of a work item."""

    row_positions: int
    batch_size: int = 1


def _estimate(runs: list[list[Item]], step_cost_rows: float) -> float:
    return sum(
        max(i.row_positions for i in run) * (sum(i.batch_size for i in run) + step_cost_rows)
        for run in runs
    )


def _every_cut(ordered: list[Item], cap: int) -> list[list[list[Item]]]:
    """Every cut into contiguous runs within the cap (brute force)."""
    cuts = []
    for marks in itertools.product((False, True), repeat=len(ordered) - 1):
        runs, run = [], [ordered[0]]
        for item, new in zip(ordered[1:], marks, strict=True):
            if new:
                runs.append(run)
                run = []
            run.append(item)
        runs.append(run)
        if all(sum(i.batch_size for i in r) <= cap for r in runs):
            cuts.append(runs)
    return cuts


def test_the_cut_is_the_cheapest_of_every_cut_within_the_cap() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ordered = sorted(
            (Item(rng.randint(1, 300), rng.randint(1, 3)) for _ in range(rng.randint(1, 9))),
            key=lambda i: i.row_positions,
        )
        cap = rng.randint(3, 8)
        step = rng.choice((0.0, 1.0, 4.0, 100.0))
        cut = cheapest_cut(ordered, cap, step)
        assert [i for run in cut for i in run] == ordered  # every item once, in order
        assert all(sum(i.batch_size for i in run) <= cap for run in cut)
        best = min(_estimate(c, step) for c in _every_cut(ordered, cap))
        assert abs(_estimate(cut, step) - best) < 1e-6


def test_a_request_larger_than_the_cap_still_runs_alone() -> None:
    cut = cheapest_cut([Item(5), Item(9, batch_size=10)], 4, 1.0)
    assert [[i.row_positions for i in run] for run in cut] == [[5], [9]]


def test_the_step_cost_decides_between_padding_and_more_batches() -> None:
    lengths = [Item(n) for n in (10, 12, 90, 100)]
    cheap_steps = cheapest_cut(lengths, 4, 0.0)
    dear_steps = cheapest_cut(lengths, 4, 1000.0)
    assert [len(run) for run in cheap_steps] == [1, 1, 1, 1]  # no padding at all
    assert [len(run) for run in dear_steps] == [4]  # one batch: 100 steps in all


def test_the_head_goes_first_with_its_run() -> None:
    head = Item(50)
    others = [Item(n) for n in (10, 48, 11, 52, 200)]
    run = head_run(head, others, 3, 1.0)
    assert run[0] is head
    assert sorted(i.row_positions for i in run) == [48, 50, 52]


def _steps(cost: StepCost, per_step_ns: float, per_row_ns: float) -> None:
    for index in range(LEARN_AFTER):
        rows = 1 + index % 8
        steps = 20 + 10 * index
        cost.record(rows, steps, int(steps * (per_step_ns + per_row_ns * rows)))


def test_the_step_cost_is_learned_from_measured_batches() -> None:
    cost = StepCost(configured=0.0, default=1.0)
    assert cost.rows == 1.0  # nothing measured: the device's default
    _steps(cost, per_step_ns=30_000, per_row_ns=10_000)
    assert abs(cost.rows - 3.0) < 0.01  # 30 us a step and 10 us a row: a step is 3 rows


def test_a_model_whose_rows_cost_nothing_keeps_batches_whole() -> None:
    cost = StepCost(configured=0.0, default=1.0)
    _steps(cost, per_step_ns=50_000, per_row_ns=0)
    assert cost.rows == WHOLE


def test_a_configured_step_cost_is_used_as_written() -> None:
    cost = StepCost(configured=2.5, default=1.0)
    _steps(cost, per_step_ns=30_000, per_row_ns=10_000)
    assert cost.rows == 2.5


def test_batches_of_one_size_teach_nothing() -> None:
    cost = StepCost(configured=0.0, default=64.0)
    for index in range(3 * LEARN_AFTER):
        cost.record(4, 10 + index, 1_000_000)
    assert cost.rows == 64.0


def test_a_batch_s_own_cost_is_learned_apart_from_its_steps() -> None:
    cost = StepCost(configured=0.0, default=1.0)
    for index in range(2 * LEARN_AFTER):
        rows, steps = 1 + index % 8, 20 + 7 * index
        cost.record(rows, steps, int(400_000 + steps * (30_000 + 10_000 * rows)))
    assert abs(cost.rows - 3.0) < 0.01
    assert abs(cost.batch_row_steps - 40.0) < 0.1  # 400 us at 10 us a row-step


def test_a_batch_s_own_cost_makes_tiny_runs_dear() -> None:
    lengths = [Item(n) for n in (10, 12, 14, 16)]
    assert len(cheapest_cut(lengths, 4, 0.0)) == 4
    assert len(cheapest_cut(lengths, 4, 0.0, batch_cost=100.0)) == 1


def test_the_fit_holds_when_long_batches_are_descheduled() -> None:
    """On a busy machine a batch's time grows by up to a fifth, and now and then by
    milliseconds (its thread off the CPU): the short batches still tell the costs."""
    for seed in range(5):
        rng = random.Random(seed)
        cost = StepCost(configured=0.0, default=1.0)
        for _ in range(200):
            rows, steps = rng.randint(1, 12), rng.randint(8, 256)
            ns = (200_000 + steps * (5_000 + 2_500 * rows)) * rng.uniform(1.0, 1.2)
            if rng.random() < 0.2:
                ns += rng.uniform(0, 4_000_000)
            cost.record(rows, steps, int(ns))
        assert abs(cost.rows - 2.0) < 0.6  # 5 us a step at 2.5 us a row: 2 rows
        assert abs(cost.batch_row_steps - 80.0) < 20  # 200 us at 2.5 us a row-step


def test_the_normal_equations_are_solved_or_found_dependent() -> None:
    points = [(1.0, float(steps), float(steps * rows)) for steps in (10, 90) for rows in (1, 5)]
    truth = (300.0, 7.0, 2.0)
    gram = [[sum(x[i] * x[j] for x in points) for j in range(3)] for i in range(3)]
    moment = [sum(x[i] * sum(t * v for t, v in zip(truth, x, strict=True)) for x in points)
              for i in range(3)]  # fmt: skip
    solved = solve_normal(gram, moment)
    assert solved is not None
    assert all(abs(a - b) < 1e-6 for a, b in zip(solved, truth, strict=True))
    one_size = [(1.0, float(steps), float(steps * 4)) for steps in (10, 50, 90)]
    gram = [[sum(x[i] * x[j] for x in one_size) for j in range(3)] for i in range(3)]
    assert solve_normal(gram, [1.0, 1.0, 1.0]) is None  # a step and a row: indistinguishable


def test_the_cut_is_the_cheapest_of_every_cut_within_the_rows_and_steps() -> None:
    """With a step budget, no run of two or more holds more rows times its longest length
    than the budget, and the cut is still the cheapest of those that keep to both bounds."""
    rng = random.Random(11)
    for _ in range(200):
        ordered = sorted(
            (Item(rng.randint(1, 60), rng.randint(1, 3)) for _ in range(rng.randint(1, 8))),
            key=lambda i: i.row_positions,
        )
        cap, most = rng.randint(3, 8), rng.randint(40, 200)
        step = rng.choice((0.0, 1.0, 100.0))
        cut = cheapest_cut(ordered, cap, step, most_steps=most)
        assert [i for run in cut for i in run] == ordered
        for run in cut:
            rows = sum(i.batch_size for i in run)
            assert len(run) == 1 or rows * run[-1].row_positions <= most
        allowed = [
            runs for runs in _every_cut(ordered, cap)
            if all(len(r) == 1 or sum(i.batch_size for i in r) * r[-1].row_positions <= most
                   for r in runs)
        ]  # fmt: skip
        assert _estimate(cut, step) == min(_estimate(runs, step) for runs in allowed)


def test_the_step_budget_splits_a_run_the_cost_alone_would_keep_whole() -> None:
    def lengths(most_steps: int) -> list[list[int]]:
        cut = cheapest_cut([Item(50), Item(60)], 8, 1000.0, most_steps=most_steps)
        return [[i.row_positions for i in run] for run in cut]

    assert lengths(0) == lengths(120) == [[50, 60]]  # 2 rows padded to 60: 120 steps
    assert lengths(119) == [[50], [60]]
    lone = Item(200)  # over the budget alone: admission refuses it; the cut still runs it
    assert cheapest_cut([lone], 8, 0.0, most_steps=100) == [[lone]]
