"""Interleaved A/B of the server: a git revision (A) against the working tree (B).

Every change in ``NOTES.md`` was judged this way. On a shared 2-core VM, two windows taken
minutes apart differ by more than most changes do, so each round starts a fresh server of
each version in turn, a few seconds apart, and takes one perf_analyzer window of each
point; the order swaps every round, so a drift of the machine's speed favours neither. The
verdict is how many rounds B won and the median of the rounds' B/A throughput ratios.
Both versions serve the working tree's model repository.

    python -m bench.ab --base REV [--point MODEL:PROTOCOL:C ...] [--rounds 4]
                       [--server-flag=--workers --server-flag=2 ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bench import perf, repo, servers
from bench.common import ROOT
from bench.inputs import plan
from bench.records import ServerPoint

BASE, HEAD = "A", "B"
PROTOCOLS = ("http", "grpc")
DEFAULT_POINTS = ("digits_cnn:http:32", "digits_cnn:grpc:32")


class Point(NamedTuple):
    """One perf_analyzer point: a model, a protocol and a concurrency."""

    model: str
    protocol: str
    concurrency: int

    def __str__(self) -> str:
        return f"{self.model} {self.protocol} c={self.concurrency}"


def parse_point(text: str) -> Point:
    """``MODEL:PROTOCOL:C``, e.g. ``digits_cnn:grpc:32``."""
    model, _, rest = text.partition(":")
    protocol, _, concurrency = rest.partition(":")
    if not model or protocol not in PROTOCOLS or not concurrency.isdigit():
        raise ValueError(f"--point {text!r}: expected MODEL:http|grpc:CONCURRENCY")
    return Point(model, protocol, int(concurrency))


def order(round_: int) -> tuple[str, str]:
    """A first in odd rounds, B first in even ones."""
    return (BASE, HEAD) if round_ % 2 else (HEAD, BASE)


@dataclass
class Comparison:
    """The windows of one point, by version, in round order."""

    point: Point
    windows: dict[str, list[ServerPoint]] = field(default_factory=lambda: {BASE: [], HEAD: []})

    def ratios(self) -> list[float]:
        """B's throughput over A's, round by round."""
        return [b.throughput / a.throughput for a, b in zip(*self._pairs(), strict=True)]

    def _pairs(self) -> tuple[list[ServerPoint], list[ServerPoint]]:
        return self.windows[BASE], self.windows[HEAD]

    def lines(self) -> list[str]:
        """Each round's figures, then the verdict."""
        out = [f"{self.point}: throughput/s, p99 ms, server CPU µs a request (A -> B)"]
        for index, (a, b) in enumerate(zip(*self._pairs(), strict=True), start=1):
            out.append(
                f"  round {index}: {a.throughput:,.0f} -> {b.throughput:,.0f}/s"
                f" ({b.throughput / a.throughput:.3f}), p99 {_p99(a)} -> {_p99(b)},"
                f" CPU {a.cpu_us_per_request:.0f} -> {b.cpu_us_per_request:.0f}"
            )
        ratios = self.ratios()
        if ratios:
            wins = sum(r > 1 for r in ratios)
            out.append(
                f"  B/A median {statistics.median(ratios):.3f};"
                f" B faster in {wins} of {len(ratios)} rounds"
            )
        return out


def _p99(point: ServerPoint) -> str:
    return f"{point.row.p99_us / 1e3:.1f}" if point.row else "-"


@contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A detached worktree of ``revision``, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as parent:
        tree = Path(parent) / "base"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", "--quiet", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


def compare(
    base: Path,
    points: Sequence[Point],
    rounds: int,
    repository: Path,
    settings: perf.PaSettings,
    work: Path,
    flags: Sequence[str] = (),
) -> list[Comparison]:
    """``rounds`` rounds of every point, each version on a fresh server of its own, both
    started with ``flags`` added."""
    sources = {BASE: base, HEAD: ROOT}
    comparisons = [Comparison(point) for point in points]
    extras = {
        model: plan(model, repo.completed_config(repository / model), {}).pa_args(work)
        for model in {point.model for point in points}
    }
    for round_ in range(1, rounds + 1):
        for comparison in comparisons:
            point, extra = comparison.point, extras[comparison.point.model]
            for version in order(round_):
                started = servers.batchserve(repository, point.model, sources[version], flags=flags)
                with started as running:
                    measured = servers.measure(
                        running, point.model, point.protocol, point.concurrency, "on",
                        settings, work, extra,
                    )  # fmt: skip
                comparison.windows[version].append(measured)
                print(f"round {round_} {point} {version}: {measured.throughput:,.0f}/s", flush=True)
    return comparisons


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against (A)")
    parser.add_argument("--point", action="append", help="MODEL:http|grpc:C (repeatable)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repo")
    parser.add_argument(
        "--server-flag", action="append", default=[],
        help="a word added to both servers' command line (repeatable, in order)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        points = [parse_point(p) for p in args.point or DEFAULT_POINTS]
    except ValueError as exc:
        parser.error(str(exc))
    settings = perf.PaSettings(args.window_ms)
    with checkout(args.base) as base, tempfile.TemporaryDirectory() as work:
        comparisons = compare(
            base, points, args.rounds, args.model_repository.resolve(), settings, Path(work),
            args.server_flag,
        )  # fmt: skip
    for comparison in comparisons:
        print("\n".join(comparison.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
