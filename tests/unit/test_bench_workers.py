"""The workers bench's paired rounds: which order each round takes the worker counts in, how
N workers are set against one process, and what the report says of it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import workers
from bench.perf import PaSettings
from bench.records import PaRow
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


def test_a_point_reads_the_owner_s_loop_the_busiest_worker_and_the_mean_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = iter([100.0, 110.0])  # the point's wall time: 10 s
    hz = os.sysconf("SC_CLK_TCK")
    ticks = {1: iter([0, 12 * hz]), 2: iter([0, 4 * hz]), 3: iter([0, 9 * hz])}
    answered = iter([(0, 0, 0), (20_000, 20_000, 625)])
    monkeypatch.setattr(workers, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(workers, "_ticks", lambda pid: next(ticks[pid]))
    loop = iter([hz, 8 * hz])
    monkeypatch.setattr(workers, "_loop_ticks", lambda pid: next(loop))
    monkeypatch.setattr(workers, "_answered", lambda port, model: next(answered))
    monkeypatch.setattr(workers, "_handed_over", lambda port: (0.0, 0.0))
    monkeypatch.setattr(workers, "_machine_ticks", lambda: (0, 1))

    def driver(*args: object) -> tuple[PaRow, str]:
        return PaRow(2_000.0, 7_500.0, 20_000.0, 0.0, 0.0), ""

    server = Serving(2, {"http_port": 1, "grpc_port": 2, "metrics_port": 3}, (1, 2, 3))
    taken = workers.take(server, ("identity", "grpc", 64), PaSettings(1000), tmp_path, driver)
    assert taken.loop_busy == pytest.approx(0.7)  # 7 s of the loop's CPU in 10 s
    assert taken.busiest_worker == pytest.approx(0.9)
    assert taken.engine_us == pytest.approx(12e6 / 20_000)
    assert taken.p50_ms == pytest.approx(7.5)
    assert taken.mean_batch == pytest.approx(32.0)


def test_in_one_process_there_is_no_separate_loop_or_worker_to_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(workers, "_ticks", lambda pid: 0)
    monkeypatch.setattr(workers, "_loop_ticks", lambda pid: 0)
    monkeypatch.setattr(workers, "_handed_over", lambda port: (0.0, 0.0))
    answered = iter([(0, 0, 0), (100, 100, 100)])
    monkeypatch.setattr(workers, "_answered", lambda port, model: next(answered))

    def driver(*args: object) -> tuple[PaRow, str]:
        return PaRow(100.0, 1_000.0, 2_000.0, 0.0, 0.0), ""

    server = Serving(1, {"http_port": 1, "grpc_port": 2, "metrics_port": 3}, (1,))
    taken = workers.take(server, ("identity", "http", 1), PaSettings(1000), tmp_path, driver)
    assert (taken.loop_busy, taken.busiest_worker, taken.mean_batch) == (None, None, 1.0)
