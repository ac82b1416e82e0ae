"""The workers bench's paired rounds: which order each round takes the worker counts in, how
N workers are set against one process, and what the report says of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench import workers
from bench.perf import PaSettings
from bench.workers import Point, Serving


def point(n: int, throughput: float, round_index: int, model: str = "identity") -> Point:
    worker_us = (40.0,) * n if n > 1 else ()
    per_frame = 7.5 if n > 1 else 0.0
    return Point(
        n, model, "grpc", 32, throughput, 30.0, worker_us, True, 0.9, round_index, 55.0, per_frame
    )


def test_each_round_takes_every_point_on_every_count_the_order_reversing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[int] = []
    taken: list[tuple[int, str, int]] = []

    @contextmanager
    def serving(n: int, repo: Path) -> Iterator[Serving]:
        started.append(n)
        yield Serving(n, {}, ())

    def take(server: Serving, at: tuple[str, str, int], *args: object) -> Point:
        round_index = args[-1]
        assert isinstance(round_index, int)
        taken.append((server.workers, at[0], round_index))
        return point(server.workers, 100.0, round_index, at[0])

    monkeypatch.setattr(workers, "serving", serving)
    monkeypatch.setattr(workers, "take", take)
    points = [("a", "http", 32), ("b", "grpc", 64)]
    found = workers.paired([1, 2], tmp_path, PaSettings(1000), tmp_path, 2, points)
    assert started == [1, 2]
    assert taken == [(1, "a", 1), (2, "a", 1), (1, "b", 1), (2, "b", 1),
                     (2, "a", 2), (1, "a", 2), (2, "b", 2), (1, "b", 2)]  # fmt: skip
    assert len(found) == 8


def test_n_workers_are_set_against_one_process_of_the_same_round() -> None:
    found = [point(1, 100.0, 1), point(2, 95.0, 1), point(1, 200.0, 2), point(2, 150.0, 2)]
    assert workers.ratios(found) == {(2, "identity", "grpc", 32): [0.95, 0.75]}


def test_the_projection_takes_the_round_of_median_throughput() -> None:
    found = [point(2, 90.0, 1), point(2, 300.0, 2), point(2, 120.0, 3), point(1, 50.0, 1)]
    chosen = {p.workers: p.round_index for p in workers.median_points(found)}
    assert chosen == {2: 3, 1: 1}


def test_the_report_judges_the_median_of_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.machine, "describe", lambda: ["Machine: test"])
    found = [point(1, 100.0, r) for r in (1, 2, 3)]
    found += [point(2, t, r) for r, t in ((1, 85.0), (2, 95.0), (3, 92.0))]
    found += [point(1, 100.0, r, "digits_cnn") for r in (1, 2, 3)]
    found += [point(2, t, r, "digits_cnn") for r, t in ((1, 95.0), (2, 80.0), (3, 70.0))]
    text = workers.render(found, PaSettings(1000, grpc_connection_per_client=True))
    assert "| 2 | identity | grpc | 32 | 0.85, 0.95, 0.92 | 0.92 | 2 of 3 |" in text
    assert "| 2 | digits_cnn | grpc | 32 | 0.95, 0.80, 0.70 | 0.80 | 1 of 3 |" in text
    assert "Median ratio >= 0.9 at 1 of 2 points." in text
    assert "3 paired rounds" in text
    assert "one per client" in text
    assert "| 2 | identity | grpc | 32 | 3 | 92 | 30.0 | 40, 40 | 55 | 90% | 7.5 |" in text
    assert "| 1 | identity | grpc | 32 | 3 | 100 | 30.0 | (one process) | 55 | 90% | — |" in text
