"""The GPU targets, judged on synthetic figures with known answers."""

from __future__ import annotations

import math

import pytest

from bench.gpu import targets
from bench.gpu.plan import JUDGED
from bench.gpu.records import (
    DIGITS,
    RESNET,
    EnginePoint,
    GpuResults,
    Key,
    RuntimeStatus,
    Served,
    Variant,
)
from bench.records import BATCHSERVE, PaRow, ServerPoint

RESNET16 = Key(RESNET, "tensorrt", "fp16")


def engine(key: Key, *times_ms: tuple[int, float]) -> list[EnginePoint]:
    return [EnginePoint(key, batch, ms / 1000, 50) for batch, ms in times_ms]


def served(
    key: Key, protocol: str, c: int, rate: float, *, requests: int = 0, executions: int = 0,
    p50_ms: float = 1.0, variant: Variant = JUDGED,
) -> Served:  # fmt: skip
    row = PaRow(rate, p50_ms * 1000, 3 * p50_ms * 1000, 0.0, 0.0)
    point = ServerPoint(BATCHSERVE, key.model, protocol, c, "on", row, requests, executions, cap=64)
    return Served(key, variant, point)


def results(*found: Served, points: list[EnginePoint] | None = None) -> GpuResults:
    done = GpuResults(runtimes=[RuntimeStatus("tensorrt", "TensorRT engine", True, "10.9")])
    done.engine = (
        points if points is not None else engine(RESNET16, (1, 1.0), (32, 8.0), (64, 15.0))
    )
    done.served = list(found)
    return done


def by_target(found: GpuResults) -> dict[str, targets.Verdict]:
    return {v.target: v for v in targets.evaluate(found)}


THROUGHPUT = "resnet50ish tensorrt fp16 gRPC, best c >= 0.8 x engine at the same batch"
LATENCY = "resnet50ish tensorrt fp16 HTTP c=1 p50 <= engine b=1 + 0.3 ms"


def test_engine_time_is_interpolated_between_timed_batches() -> None:
    points = engine(RESNET16, (1, 1.0), (32, 8.0), (64, 15.0))
    assert targets.engine_time_s(points, 48) == pytest.approx(0.0115)
    assert targets.engine_time_s(points, 1) == pytest.approx(0.001)
    assert targets.engine_time_s(points, 0.5) == pytest.approx(0.001)  # below: batch 1's time
    assert targets.engine_time_s(points, 128) == pytest.approx(0.030)  # beyond: per row
    assert targets.engine_time_s([], 4) is None
    assert targets.engine_time_s(points, math.nan) is None


def test_served_throughput_is_judged_at_the_best_concurrency_and_its_mean_batch() -> None:
    found = results(
        served(RESNET16, "grpc", 16, 2000.0, requests=3200, executions=200),  # batch 16
        served(RESNET16, "grpc", 64, 3500.0, requests=6400, executions=200),  # batch 32
        served(RESNET16, "grpc", 256, 3300.0, requests=6400, executions=100),
    )
    verdict = by_target(found)[THROUGHPUT]
    # The engine does 32 / 8 ms = 4,000/s at batch 32: 3,500 is 0.875 of it.
    assert verdict.passed is True
    assert verdict.figure == pytest.approx(0.875)
    assert "3,500/s at c=64 (mean batch 32.0) = 0.88 x the engine's 4,000/s" in verdict.measured


def test_served_throughput_below_the_share_fails() -> None:
    found = results(served(RESNET16, "grpc", 64, 3000.0, requests=6400, executions=200))
    assert by_target(found)[THROUGHPUT].passed is False


def test_other_variants_and_http_do_not_count_for_the_throughput_target() -> None:
    found = results(
        served(RESNET16, "http", 64, 3900.0, requests=6400, executions=200),
        served(RESNET16, "grpc", 64, 3900.0, requests=6400, executions=200,
               variant=Variant(batching=True, graphs=True)),
    )  # fmt: skip
    verdict = by_target(found)[THROUGHPUT]
    assert verdict.passed is None
    assert verdict.measured == "not measured in this run"


def test_a_failed_point_is_not_measured_with_its_error() -> None:
    point = ServerPoint(BATCHSERVE, RESNET, "grpc", 64, "on", None, error="boom\nconnection reset")
    verdict = by_target(results(Served(RESNET16, JUDGED, point)))[THROUGHPUT]
    assert (verdict.passed, verdict.measured) == (None, "point failed: connection reset")


def test_c1_latency_passes_within_the_overhead_and_fails_beyond_it() -> None:
    quick = results(served(RESNET16, "http", 1, 800.0, p50_ms=1.25))
    verdict = by_target(quick)[LATENCY]
    assert verdict.passed is True
    assert verdict.measured == "1.250 ms = 1.000 + 0.250 ms"
    slow = results(served(RESNET16, "http", 1, 700.0, p50_ms=1.35))
    assert by_target(slow)[LATENCY].passed is False


def test_latency_without_the_engine_s_batch_1_is_not_measured() -> None:
    found = results(served(RESNET16, "http", 1, 800.0), points=engine(RESNET16, (2, 1.0), (4, 1.5)))
    assert by_target(found)[LATENCY].measured == "no in-process b=1"


def test_every_present_runtime_is_judged_and_absent_ones_are_not() -> None:
    found = results()
    found.runtimes.append(RuntimeStatus("ort-cuda", "ONNX Runtime, CUDA EP", False, "", "no EP"))
    labels = [v.target for v in targets.evaluate(found)]
    assert labels == [
        THROUGHPUT,
        f"{DIGITS} tensorrt fp16 HTTP c=1 p50 <= engine b=1 + 0.3 ms",
        LATENCY,
    ]


def test_a_served_p50_below_the_engine_s_is_shown_as_a_difference() -> None:
    found = results(served(RESNET16, "http", 1, 800.0, p50_ms=0.9))
    verdict = by_target(found)[LATENCY]
    assert (verdict.passed, verdict.measured) == (True, "0.900 ms = 1.000 - 0.100 ms")
