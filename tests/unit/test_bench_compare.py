"""Comparing two benchmark runs target by target: each run's round spread is its noise."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import compare
from bench.compare import Agreement, Row
from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    IDENTITY,
    CeilingPoint,
    PaRow,
    Results,
    ServerPoint,
    dump,
)
from bench.targets import Verdict

TARGET = "small HTTP c=32 >= 0.6 x aiohttp echo"


def judged(figure: float | None, *rounds: float, passed: bool | None = True) -> Verdict:
    return Verdict(TARGET, "", passed, figure, rounds)


@pytest.mark.parametrize(
    ("base", "new", "agreement"),
    [
        (judged(0.63, 0.55, 0.63, 0.67), judged(0.50, 0.47, 0.50, 0.56), Agreement.WITHIN),
        (judged(0.63, 0.55, 0.63, 0.67), judged(0.45, 0.40, 0.45, 0.52), Agreement.OUTSIDE),
        (judged(0.63, 0.55, 0.63, 0.67), judged(0.60), Agreement.WITHIN),
        (judged(0.63, 0.55, 0.63, 0.67), judged(0.70), Agreement.OUTSIDE),
        (judged(0.38), judged(0.48), Agreement.ONE_WINDOW),
        (judged(0.38), judged(None, passed=None), Agreement.MISSING),
    ],
)
def test_two_runs_agree_when_their_round_ranges_overlap(
    base: Verdict, new: Verdict, agreement: Agreement
) -> None:
    assert Row(TARGET, base, new).agreement is agreement


def test_targets_of_either_run_are_listed_and_a_lone_one_is_missing() -> None:
    other = replace(judged(0.9), target="other")
    rows = compare.compare([judged(0.6, 0.5, 0.7)], [other, judged(0.62, 0.6, 0.64)])
    assert [(r.target, r.agreement) for r in rows] == [
        (TARGET, Agreement.WITHIN),
        ("other", Agreement.MISSING),
    ]


def run_of(rates: list[tuple[float, float]]) -> Results:
    """A run with one request-bound model judged at c=32 in rounds of (echo, model) rates."""
    results = Results(shipped={"small": "on"})
    results.ceilings.append(CeilingPoint("small", 32, 32 / 93000, 100))
    results.points.append(ServerPoint(AIOHTTP, IDENTITY, "http", 32, "", PaRow(1e4, 1, 2, 0, 0)))
    for number, (echo, model) in enumerate(rates):
        floor = ServerPoint(AIOHTTP, IDENTITY, "http", 32, "", PaRow(echo, 1, 2, 0, 0))
        ours = ServerPoint(BATCHSERVE, "small", "http", 32, "on", PaRow(model, 1, 2, 0, 0))
        results.points += [
            replace(floor, beside="small", round=number),
            replace(ours, round=number),
        ]
    return results


def test_the_command_fails_when_a_ratio_leaves_the_first_runs_band(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, near, far = tmp_path / "base.json", tmp_path / "near.json", tmp_path / "far.json"
    base.write_text(dump(run_of([(5000, 3000), (5000, 3300), (5000, 3500)])))  # 0.60-0.70
    near.write_text(dump(run_of([(6000, 3300), (6000, 3800), (6000, 4000)])))  # 0.55-0.67
    far.write_text(dump(run_of([(6000, 2700), (6000, 3000), (6000, 3200)])))  # 0.45-0.53
    assert compare.main([str(base), str(near)]) == 0
    assert f"| {TARGET} | 0.66 (0.60-0.70) PASS | 0.63 (0.55-0.67) PASS | within noise |" in (
        capsys.readouterr().out
    )
    out = tmp_path / "table.md"
    assert compare.main([str(base), str(far), "--out", str(out)]) == 1
    table = out.read_text()
    assert f"| {TARGET} | 0.66 (0.60-0.70) PASS | 0.50 (0.45-0.53) FAIL | OUTSIDE noise |" in table
    assert f"Verdicts that changed: {TARGET}." in table


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        compare.main([str(tmp_path / "none.json"), str(tmp_path / "none.json")])
    assert stopped.value.code == 2
