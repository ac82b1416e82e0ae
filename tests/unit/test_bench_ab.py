"""The A/B tool: which version serves each window, in which order, and how the rounds add up.

The servers and perf_analyzer are replaced by recorders (what is under test is the
interleaving and the arithmetic); the worktree is a real ``git worktree``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from bench import ab, perf, servers
from bench.common import ROOT
from bench.records import BATCHSERVE, PaRow, ServerPoint


def window(throughput: float, p99_ms: float = 10.0, cpu_us: float = 200.0) -> ServerPoint:
    row = PaRow(throughput, 1_000.0, p99_ms * 1e3, 0.0, 0.0)
    return ServerPoint(BATCHSERVE, "m", "http", 32, "on", row, requests=1_000,
                       executions=50, cpu_s=cpu_us * 1e-3)  # fmt: skip


def test_a_point_names_model_protocol_and_concurrency() -> None:
    assert ab.parse_point("digits_cnn:grpc:32") == ab.Point("digits_cnn", "grpc", 32)
    for bad in ("digits_cnn:grpc", "digits_cnn:rest:32", ":http:1", "m:http:many"):
        with pytest.raises(ValueError, match=r"MODEL:http\|grpc:CONCURRENCY"):
            ab.parse_point(bad)


def test_the_version_that_goes_first_swaps_every_round() -> None:
    assert [ab.order(r) for r in (1, 2, 3)] == [("A", "B"), ("B", "A"), ("A", "B")]


def test_the_verdict_is_the_median_ratio_and_the_rounds_won() -> None:
    comparison = ab.Comparison(ab.Point("m", "http", 32))
    comparison.windows["A"] += [window(1000), window(1000), window(2000)]
    comparison.windows["B"] += [window(1100), window(900), window(2400, p99_ms=8.5)]
    assert comparison.ratios() == pytest.approx([1.1, 0.9, 1.2])
    lines = comparison.lines()
    assert lines[0].startswith("m http c=32")
    assert "round 3: 2,000 -> 2,400/s (1.200), p99 10.0 -> 8.5, CPU 200 -> 200" in lines[3]
    assert lines[-1] == "  B/A median 1.100; B faster in 2 of 3 rounds"


def test_each_round_serves_both_versions_from_their_own_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[tuple[str, Path | None]] = []
    flagged: list[tuple[str, ...]] = []

    @contextmanager
    def batchserve(
        repository: Path, model: str, source: Path | None = None, flags: Sequence[str] = ()
    ) -> Iterator[Any]:
        served.append((model, source))
        flagged.append(tuple(flags))
        yield servers.Running(BATCHSERVE, cast(Any, None), {"http": 1, "grpc": 2})

    def measure(running: Any, model: str, protocol: str, c: int, *rest: Any) -> ServerPoint:
        return window(1000.0 + len(served))

    monkeypatch.setattr(servers, "batchserve", batchserve)
    monkeypatch.setattr(servers, "measure", measure)
    base = tmp_path / "base"
    points = [ab.Point("digits_cnn", "http", 32), ab.Point("digits_cnn", "grpc", 4)]
    comparisons = ab.compare(
        base, points, 2, ROOT / "model_repo", perf.PaSettings(1000), tmp_path, ["--workers", "2"]
    )
    assert [source for _, source in served] == [base, ROOT, base, ROOT, ROOT, base, ROOT, base]
    assert set(flagged) == {("--workers", "2")}  # both versions, every round
    assert [len(c.windows["A"]) for c in comparisons] == [2, 2]
    # round 2 took B first: its window is the earlier one of that round
    assert comparisons[0].windows["B"][1].throughput < comparisons[0].windows["A"][1].throughput


def test_the_base_is_a_worktree_of_the_revision_and_goes_away_after() -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    with ab.checkout(head) as tree:
        assert (tree / "server" / "batchserve" / "__init__.py").is_file()
        checked_out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                                     capture_output=True, text=True, check=True)  # fmt: skip
        assert checked_out.stdout.strip() == head
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    assert str(tree) not in listed
