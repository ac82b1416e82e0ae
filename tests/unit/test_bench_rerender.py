"""A run's figures saved as JSON give back the same results and the same report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import rerender
from bench.records import AIOHTTP, BATCHSERVE, IDENTITY, CeilingPoint, dump, load
from bench.report import render
from bench.targets import evaluate
from tests.unit.test_bench_report import point, sample


def test_figures_round_trip_and_render_the_same_report(tmp_path: Path) -> None:
    found = sample()
    found.points += [
        replace(point(AIOHTTP, IDENTITY, "http", 9000), beside="small", round=1),
        replace(point(BATCHSERVE, "small", "http", 7000), round=1, error="slow"),
    ]
    found.ceilings.append(CeilingPoint("small", 32, 0.0005, 40, "small", "http", 1))
    found.notes = ["a note"]
    found.duration_s = 61.5
    again = load(dump(found))
    assert again == found
    assert again.points[4].row is None  # a failed point stays failed

    figures = tmp_path / "RESULTS.json"
    figures.write_text(dump(found))
    assert rerender.main([str(figures)]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == render(found, evaluate(found))


def test_missing_figures_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        rerender.main([str(tmp_path / "RESULTS.json")])
    assert stopped.value.code == 2
    assert "RESULTS.json does not exist: `make bench` writes it" in capsys.readouterr().err
