"""The soak's arithmetic and its verdict: latency windows, RSS growth, p99 drift.

Pure functions over plain values, so the thresholds are unit-tested without a server.

The memory check compares resident memory at the end of the warm-up with the end of the
run: allocators, ONNX Runtime's arena and Python's caches grow during the warm-up and
should then hold steady, so growth past ``max(5 %, 16 MiB)`` afterwards is taken as a leak.
The p99 of the last window is compared with the first window after the warm-up; the run
fails only on a gross drift (over 3x and over 5 ms more), since the machine is shared and
a few slow requests move a p99 by far less than a degradation would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1024 * 1024
RSS_GROWTH_FRACTION = 0.05
RSS_GROWTH_FLOOR_BYTES = 16 * MIB
P99_DRIFT_RATIO = 3.0
P99_DRIFT_FLOOR_S = 0.005


@dataclass(frozen=True)
class RssSample:
    """Resident memory of the server at ``t`` seconds from the start of the load."""

    t: float
    rss: int


@dataclass(frozen=True)
class RssCheck:
    baseline: RssSample  # the first sample at or after the end of the warm-up
    final: RssSample
    peak: int
    allowance: int

    @property
    def growth(self) -> int:
        return self.final.rss - self.baseline.rss

    @property
    def passed(self) -> bool:
        return self.growth < self.allowance

    @property
    def slope_mib_per_min(self) -> float:
        """Growth per minute between the two samples (the leak rate, if it is one)."""
        span = self.final.t - self.baseline.t
        return self.growth / MIB * 60 / span if span > 0 else 0.0


@dataclass(frozen=True)
class Window:
    """Latencies of the good requests answered in [start, end) seconds from the start."""

    start: float
    end: float
    count: int
    p50: float
    p99: float
    warmup: bool


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def rss_allowance(baseline_bytes: int) -> int:
    """Growth allowed after the warm-up: 5 % of the warm-up's RSS, at least 16 MiB."""
    return max(int(RSS_GROWTH_FRACTION * baseline_bytes), RSS_GROWTH_FLOOR_BYTES)


def rss_check(samples: Sequence[RssSample], warmup_end: float) -> RssCheck:
    """Growth from the first sample at or after the warm-up to the last sample."""
    after = [s for s in samples if s.t >= warmup_end]
    if not after:
        raise ValueError("no RSS sample after the warm-up: the run was shorter than its warm-up")
    baseline, final = after[0], after[-1]
    return RssCheck(baseline, final, max(s.rss for s in after), rss_allowance(baseline.rss))


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (0 < q <= 100): a latency some request really had."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[min(len(ordered), max(1, rank)) - 1]


def window_bounds(start: float, end: float, width: float) -> list[tuple[float, float]]:
    """[start, end) cut into ``width``-second windows; a last piece under half a width joins
    the window before it, so no window's p99 rests on a handful of requests."""
    if end <= start:
        return []
    bounds, left = [], start
    while end - left >= 1.5 * width:
        bounds.append((left, left + width))
        left += width
    bounds.append((left, end))
    return bounds


def latency_windows(
    latencies: Sequence[tuple[float, float]], warmup_end: float, end: float, width: float
) -> list[Window]:
    """p50/p99 per window of (time answered, seconds taken) pairs; warm-up windows apart."""
    bounds = window_bounds(0.0, warmup_end, width) + window_bounds(warmup_end, end, width)
    windows = []
    for left, right in bounds:
        inside = [seconds for t, seconds in latencies if left <= t < right]
        windows.append(
            Window(left, right, len(inside), percentile(inside, 50), percentile(inside, 99),
                   warmup=right <= warmup_end)
        )  # fmt: skip
    return windows


def p99_drift(windows: Sequence[Window]) -> tuple[float, float, float]:
    """(first, last, last / first) p99 of the windows after the warm-up."""
    measured = [w for w in windows if not w.warmup and w.count]
    if not measured:
        return math.nan, math.nan, math.nan
    first, last = measured[0].p99, measured[-1].p99
    return first, last, last / first if first > 0 else math.nan


def drift_check(windows: Sequence[Window], limit: float = P99_DRIFT_RATIO) -> Check:
    first, last, ratio = p99_drift(windows)
    gross = ratio > limit and last - first > P99_DRIFT_FLOOR_S
    detail = (
        f"p99 {first * 1000:.1f} ms -> {last * 1000:.1f} ms ({ratio:.2f}x; "
        f"fails over {limit:g}x and {P99_DRIFT_FLOOR_S * 1000:g} ms more)"
    )
    return Check("p99 drift", not gross, detail)


def memory_check(rss: RssCheck) -> Check:
    detail = (
        f"{rss.baseline.rss / MIB:.1f} MiB -> {rss.final.rss / MIB:.1f} MiB "
        f"({rss.growth / MIB:+.1f} MiB, {rss.slope_mib_per_min:+.2f} MiB/min; "
        f"allowed < {rss.allowance / MIB:.1f} MiB)"
    )
    return Check("RSS growth", rss.passed, detail)


def errors_check(unexpected: int, total: int) -> Check:
    return Check("errors", unexpected == 0, f"{unexpected} unexpected of {total:,} requests")


def alive_check(died: int | None, stop_code: int | None, unanswered: str = "") -> Check:
    """The server ran to the end of the load (``died`` None), still answered afterwards
    (``unanswered`` empty) and then stopped with status 0."""
    if died is not None:
        return Check("server alive", False, f"exited with {died} during the load")
    if unanswered:
        return Check("server alive", False, f"stopped answering: {unanswered}")
    detail = f"ran to the end; exit status {stop_code} after SIGTERM"
    return Check("server alive", stop_code == 0, detail)


def log_check(errors: int, first: Sequence[str]) -> Check:
    """A server that logs errors under load has met something it did not expect."""
    detail = f"{errors} ERROR records" + (f", the first: {first[0]}" if first else "")
    return Check("server log", errors == 0, detail)
