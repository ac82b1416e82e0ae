"""What metric collection costs on the hot path: per request and per batch.

Compares the statistics calls the scheduler and dataplane make with their Prometheus
observations switched on and off (a ModelStats whose Observations do nothing).

    python bench/metrics_overhead.py [--out bench/METRICS_OVERHEAD.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import timeit
from pathlib import Path

from batchserve.observability.stats import ModelStats

ROOT = Path(__file__).resolve().parent.parent
REPEAT, NUMBER = 7, 20_000


class _Silent:
    """Observations that record nothing: the cost of ModelStats without Prometheus."""

    def on_request(self, total_ns: int, queue_ns: int) -> None:
        return None

    def on_batch(self, size: int, compute_ns: int, cap: int) -> None:
        return None


def _per_call_us(statement: object) -> float:
    runs = timeit.repeat(statement, repeat=REPEAT, number=NUMBER)  # type: ignore[arg-type]
    return min(runs) / NUMBER * 1e6


def measure() -> dict[str, float]:
    with_metrics, without = ModelStats(), ModelStats()
    without.observed = _Silent()  # type: ignore[assignment]
    results = {}
    for label, stats in (("on", with_metrics), ("off", without)):
        results[f"request_{label}"] = _per_call_us(
            lambda s=stats: s.record_request(True, 1_234_567, 234_567, protocol="http")
        )
        results[f"batch_{label}"] = _per_call_us(
            lambda s=stats: s.record_batch(8, 12_000, 345_000, 9_000, cap=64)
        )
    return results


def render(results: dict[str, float]) -> str:
    request = results["request_on"] - results["request_off"]
    batch = results["batch_on"] - results["batch_off"]
    return "\n".join([
        "# Cost of metric collection on the hot path",
        "",
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.2f}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
        f" Best of {REPEAT} runs of {NUMBER:,} calls (`bench/metrics_overhead.py`).",
        "",
        "| call | metrics on µs | metrics off µs | added µs |",
        "|---|---:|---:|---:|",
        f"| record_request (per request) | {results['request_on']:.2f} | "
        f"{results['request_off']:.2f} | {request:.2f} |",
        f"| record_batch (per batch) | {results['batch_on']:.2f} | "
        f"{results['batch_off']:.2f} | {batch:.2f} |",
        "",
        "Counters and gauges are read from the statistics at scrape time, so nothing else is "
        "added per request.",
    ]) + "\n"  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "METRICS_OVERHEAD.md")
    args = parser.parse_args()
    results = measure()
    args.out.write_text(render(results))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
