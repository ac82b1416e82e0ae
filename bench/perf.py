"""One perf_analyzer point: the command the peers used, its CSV row, a retry when unstable."""

from __future__ import annotations

import csv
import io
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import perf_analyzer, running_on
from bench.records import PaRow

UNSTABLE = "Failed to obtain stable measurement"
# A noisy shared machine may never settle within 25 %; the point is then taken at 100 % and
# marked unstable rather than lost.
LOOSE_STABILITY = 100
# perf_analyzer's gRPC clients share a connection, up to this many per connection (6 unless
# set; the C++ client library reads it).
CHANNEL_SHARE = "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"


@dataclass(frozen=True)
class PaSettings:
    """How each point is measured (perf_analyzer flags)."""

    window_ms: int
    stability: int = 25
    max_trials: int = 8
    grpc_connection_per_client: bool = False
    """Each concurrent client on a gRPC connection of its own, as independent clients are;
    by default perf_analyzer's share one connection six at a time, and a server whose
    processes split connections (``--workers``) then sees a few, unevenly spread."""
    cpus: tuple[int, ...] = ()
    """The CPUs perf_analyzer runs on (``bench.cpu_split``); empty: any this process may use."""

    def environment(self) -> dict[str, str] | None:
        """perf_analyzer's environment (None: this process's)."""
        if not self.grpc_connection_per_client:
            return None
        return {**os.environ, CHANNEL_SHARE: "1"}

    @property
    def timeout_s(self) -> float:
        return 60 + 2 * (self.max_trials + 2) * self.window_ms / 1000


def command(
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    settings: PaSettings,
    out: Path,
    binary: str | None = None,
) -> list[str]:
    """perf_analyzer's command line for one point (batch 1 per request, binary tensors)."""
    return [
        binary or perf_analyzer(), "-m", model, "-u", url, "-i", protocol, "-b", "1",
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(settings.window_ms),
        "--stability-percentage", str(settings.stability),
        "--max-trials", str(settings.max_trials), "-f", str(out),
    ]  # fmt: skip


def parse_csv(text: str, *, stable: bool = True) -> PaRow:
    """The last row of perf_analyzer's ``-f`` CSV (one row per concurrency)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("perf_analyzer wrote a CSV without rows")
    row = rows[-1]
    return PaRow(
        throughput=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
        queue_us=float(row.get("Server Queue") or 0),
        compute_us=float(row.get("Server Compute Infer") or 0),
        stable=stable,
    )


def run(
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    settings: PaSettings,
    work: Path,
    extra: Sequence[str] = (),
) -> tuple[PaRow | None, str]:
    """Run one point; on an unstable result run it again at loose stability.

    Returns the row (None if none came) and perf_analyzer's output tail when it failed.
    """
    row, error = _attempt(model, protocol, url, concurrency, settings, work, extra)
    if row is None and UNSTABLE in error:
        loose = replace(settings, stability=LOOSE_STABILITY)
        row, error = _attempt(model, protocol, url, concurrency, loose, work, extra)
        if row is not None:
            row = PaRow(row.throughput, row.p50_us, row.p99_us, row.queue_us, row.compute_us, False)
    return row, error


def _attempt(
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    settings: PaSettings,
    work: Path,
    extra: Sequence[str],
) -> tuple[PaRow | None, str]:
    out = work / f"pa-{model}-{protocol}-{concurrency}.csv"
    out.unlink(missing_ok=True)
    argv = [*command(model, protocol, url, concurrency, settings, out), *extra]
    try:
        with running_on(settings.cpus):
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=settings.timeout_s,
                env=settings.environment(),
            )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"perf_analyzer did not finish within {settings.timeout_s:.0f} s"
    if done.returncode != 0 or not out.exists():
        return None, (done.stdout + done.stderr)[-1200:]
    return parse_csv(out.read_text()), ""
