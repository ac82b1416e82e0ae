"""NVIDIA's perf_analyzer, run once per point: its command line, its CSV, a retry when unstable.

perf_analyzer measures windows until three in a row agree within ``--stability-percentage``
(it needs at least three, so ``--max-trials`` below 3 always fails). Its ``-f`` CSV holds
one row per concurrency with latencies in microseconds.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from batchserve.profiling.errors import ProfileError

UNSTABLE = "Failed to obtain stable measurement"
LOOSE_STABILITY = 100
"""A point that never settles within the asked stability is taken once more, at 100 % where
it asked for less, and marked unstable rather than lost (a shared machine may never settle,
and a busy moment may upset even --quick's 1000 %)."""


@dataclass(frozen=True, slots=True)
class Window:
    """How each point is measured (perf_analyzer's -p, -s and -r)."""

    interval_ms: int
    stability_percent: int
    max_trials: int

    @property
    def timeout_s(self) -> float:
        return 60 + 2 * (self.max_trials + 2) * self.interval_ms / 1000


QUICK_WINDOW = Window(interval_ms=500, stability_percent=1000, max_trials=3)
"""Three half-second windows, whatever they say: about 2 s a point."""
FULL_WINDOW = Window(interval_ms=1000, stability_percent=20, max_trials=6)
"""Windows of 1 s until three agree within 20 %: 3-6 s a point on a quiet machine."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One perf_analyzer row: client-side throughput and latency percentiles."""

    concurrency: int
    throughput: float  # inferences per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    stable: bool = True


@dataclass(frozen=True, slots=True)
class Target:
    """What perf_analyzer drives: a model on a server, with the inputs it sends.

    Args:
        extra: further perf_analyzer flags (``--shape``, ``--input-data``).
    """

    binary: Path
    model: str
    protocol: str
    url: str
    extra: Sequence[str] = ()


def find(explicit: Path | None) -> Path:
    """The binary to run: ``explicit``, else the one beside this Python (where the project's
    installer puts it), else the first on PATH."""
    if explicit is not None:
        if not (explicit.is_file() and shutil.which(str(explicit))):
            raise ProfileError(f"--perf-analyzer {explicit}: not an executable file")
        return explicit
    found = shutil.which("perf_analyzer", path=str(Path(sys.executable).parent))
    found = found or shutil.which("perf_analyzer")
    if found is None:
        raise ProfileError(
            "perf_analyzer not found beside this Python or on PATH: install it (it comes in "
            "the tritonclient wheel of a Triton release) or pass --perf-analyzer PATH"
        )
    return Path(found)


def command(target: Target, concurrency: int, window: Window, csv_path: Path) -> list[str]:
    """One point, one request of batch 1 at a time per client."""
    return [
        str(target.binary), "-m", target.model, "-u", target.url, "-i", target.protocol,
        "-b", "1", "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(window.interval_ms),
        "--stability-percentage", str(window.stability_percent),
        "--max-trials", str(window.max_trials), "-f", str(csv_path), *target.extra,
    ]  # fmt: skip


def parse_csv(text: str) -> Measurement:
    """The last row of perf_analyzer's ``-f`` CSV; latencies turn from µs into ms."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ProfileError("perf_analyzer wrote a CSV without rows")
    row = rows[-1]
    try:
        return Measurement(
            concurrency=int(row["Concurrency"]),
            throughput=float(row["Inferences/Second"]),
            p50_ms=float(row["p50 latency"]) / 1000,
            p95_ms=float(row["p95 latency"]) / 1000,
            p99_ms=float(row["p99 latency"]) / 1000,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"perf_analyzer's CSV lacks a usable column: {exc}") from None


def measure(target: Target, concurrency: int, window: Window) -> Measurement:
    """One point; an unstable one is measured again, at least as loosely as
    ``LOOSE_STABILITY``, and so marked."""
    try:
        return _run(target, concurrency, window)
    except ProfileError as exc:
        if UNSTABLE not in exc.message:
            raise
    loose = replace(window, stability_percent=max(window.stability_percent, LOOSE_STABILITY))
    return replace(_run(target, concurrency, loose), stable=False)


def _run(target: Target, concurrency: int, window: Window) -> Measurement:
    with tempfile.TemporaryDirectory(prefix="batchserve-profile-") as work:
        csv_path = Path(work) / "point.csv"
        argv = command(target, concurrency, window, csv_path)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=window.timeout_s)
        except subprocess.TimeoutExpired:
            raise ProfileError(
                f"perf_analyzer did not finish within {window.timeout_s:.0f} s"
            ) from None
        if done.returncode != 0 or not csv_path.is_file():
            raise ProfileError(_failure(done))
        return parse_csv(csv_path.read_text())


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    """perf_analyzer's own last words (it prints its errors on stdout)."""
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    tail = " / ".join(lines[-3:]) or "no output"
    return f"perf_analyzer exited with status {done.returncode}: {tail}"
