"""The GPU issue's targets, judged for each runtime present on one check's figures.

1. Served throughput: the ResNet-50-like model in FP16 (batching on, graphs off) over gRPC,
   at the concurrency where it served most, reaches 0.8 x the in-process engine's throughput
   at the same batch size: the mean batch the server formed there, the engine's time per
   batch interpolated between the batch sizes it was timed at.
2. Latency at concurrency 1: HTTP p50 no more than the engine's batch-1 time + 0.3 ms, for
   each network in FP16 as served in the judged configuration.
3. Request handling across cores, where the machine has the cores (``cores.py``): N
   request-handling processes serve at least 0.7 x N x one process's throughput.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from bench.gpu import cores
from bench.gpu.plan import JUDGED
from bench.gpu.records import MODELS, RESNET, EnginePoint, GpuResults, Key, Served
from bench.targets import Verdict, last_line, rate

SERVED_SHARE = 0.8
OVERHEAD_MS = 0.3
PRECISION = "fp16"


def engine_time_s(points: Sequence[EnginePoint], batch: float) -> float | None:
    """Seconds per batch of ``batch`` rows: linear between the sizes timed, the smallest
    size's time below them, and the largest size's time per row beyond them."""
    ordered = sorted(points, key=lambda p: p.batch)
    if not ordered or math.isnan(batch):
        return None
    if batch <= ordered[0].batch:
        return ordered[0].median_s
    for low, high in itertools.pairwise(ordered):
        if low.batch <= batch <= high.batch:
            share = (batch - low.batch) / (high.batch - low.batch)
            return low.median_s + share * (high.median_s - low.median_s)
    last = ordered[-1]
    return last.median_s * batch / last.batch


def evaluate(results: GpuResults) -> list[Verdict]:
    verdicts = []
    for runtime in results.present():
        verdicts.append(throughput(results, Key(RESNET, runtime, PRECISION)))
        verdicts += [latency(results, Key(m, runtime, PRECISION)) for m in MODELS]
    if results.cores:
        verdicts += cores.verdicts(results.cores)
    return verdicts


def throughput(results: GpuResults, key: Key) -> Verdict:
    target = f"{key.label} gRPC, best c >= {SERVED_SHARE} x engine at the same batch"
    taken = results.served_points(key, JUDGED, "grpc")
    measured = [s for s in taken if s.point.row is not None]
    if not measured:
        return Verdict(target, _missing(taken), None)
    best = max(measured, key=lambda s: s.point.throughput)
    batch = best.point.mean_batch
    seconds = engine_time_s(results.engine_points(key), batch)
    if seconds is None:
        return Verdict(target, "no in-process figures, or no batch counted", None)
    engine = batch / seconds
    ratio = best.point.throughput / engine
    text = (
        f"{rate(best.point.throughput)}/s at c={best.point.concurrency} (mean batch "
        f"{batch:.1f}) = {ratio:.2f} x the engine's {rate(engine)}/s at that batch"
    )
    return Verdict(target, text, ratio >= SERVED_SHARE, ratio)


def latency(results: GpuResults, key: Key) -> Verdict:
    target = f"{key.label} HTTP c=1 p50 <= engine b=1 + {OVERHEAD_MS} ms"
    taken = [s for s in results.served_points(key, JUDGED, "http") if s.point.concurrency == 1]
    alone = next((p for p in results.engine_points(key) if p.batch == 1), None)
    row = taken[0].point.row if taken else None
    if row is None or alone is None:
        return Verdict(target, _missing(taken) if alone else "no in-process b=1", None)
    p50_ms, alone_ms = row.p50_us / 1000, alone.median_s * 1000
    extra = p50_ms - alone_ms
    sign = "+" if extra >= 0 else "-"
    text = f"{p50_ms:.3f} ms = {alone_ms:.3f} {sign} {abs(extra):.3f} ms"
    return Verdict(target, text, extra <= OVERHEAD_MS, extra)


def _missing(taken: Sequence[Served]) -> str:
    failed = next((s for s in taken if s.point.row is None), None)
    if failed is None:
        return "not measured in this run"
    return f"point failed: {last_line(failed.point.error)}"
