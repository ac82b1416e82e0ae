"""The performance issue's targets, judged on synthetic figures with known answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    PYTRITON,
    RAW_ASGI,
    CeilingPoint,
    PaRow,
    Results,
    ServerPoint,
)
from bench.targets import Verdict, compute_bound, evaluate


def point(
    server: str, model: str, protocol: str, c: int, rate: float, *,
    batching: str = "on", p50_ms: float = 1.0, p99_ms: float = 5.0,
    requests: int = 0, executions: int = 0, cap: int = 64,
) -> ServerPoint:  # fmt: skip
    row = PaRow(rate, p50_ms * 1000, p99_ms * 1000, 0.0, 0.0)
    return ServerPoint(server, model, protocol, c, batching, row, requests, executions, cap=cap)


def floors() -> list[ServerPoint]:
    return [
        point(AIOHTTP, IDENTITY, "http", 32, 13000),
        point(RAW_ASGI, IDENTITY, "http", 32, 18000),
        point(GRPC_AIO, IDENTITY, "grpc", 32, 5800),
    ]


def results(*points: ServerPoint, ceilings: tuple[CeilingPoint, ...] = ()) -> Results:
    done = Results(ceilings=list(ceilings), points=[*floors(), *points])
    done.shipped = {p.model: "on" for p in done.points}
    return done


def verdicts(found: Results, contains: str) -> dict[str, bool | None]:
    """Verdicts whose target names ``contains``, the identity model's left out."""
    return {
        v.target: v.passed
        for v in evaluate(found)
        if contains in v.target and not v.target.startswith(IDENTITY)
    }


def test_compute_bound_model_is_judged_against_its_ceiling_at_c16() -> None:
    ceilings = (CeilingPoint("cnn", 1, 0.0125, 10), CeilingPoint("cnn", 64, 64 / 88, 5))
    found = results(
        point(BATCHSERVE, "cnn", "http", 16, 84.0),  # 0.955 x 88
        point(BATCHSERVE, "cnn", "grpc", 16, 83.0),  # 0.943 x 88
        ceilings=ceilings,
    )
    assert compute_bound(found, "cnn") is True
    assert verdicts(found, "ceiling") == {
        "cnn HTTP c=16 >= 0.95 x ceiling": True,
        "cnn gRPC c=16 >= 0.95 x ceiling": False,
    }
    assert not verdicts(found, "echo")


def test_request_bound_model_is_judged_against_the_floor_of_its_protocol() -> None:
    found = results(
        point(BATCHSERVE, "small", "http", 32, 8000),  # 0.615 x 13,000; 0.44 x 18,000
        point(BATCHSERVE, "small", "grpc", 32, 3000),  # 0.517 x 5,800
        ceilings=(CeilingPoint("small", 32, 32 / 93000, 100),),
    )
    assert compute_bound(found, "small") is False
    assert verdicts(found, "echo") == {
        "small HTTP c=32 >= 0.6 x aiohttp echo": True,
        "small gRPC c=32 >= 0.6 x grpc.aio echo": False,
        "(stretch) small HTTP c=32 >= 0.6 x raw ASGI echo": False,
    }


def test_p99_against_pytriton_only_when_the_peer_was_measured() -> None:
    ours = point(BATCHSERVE, "small", "http", 32, 8000, p99_ms=4.0)
    theirs = point(PYTRITON, "small", "http", 32, 2400, p99_ms=25.0)
    ceilings = (CeilingPoint("small", 32, 32 / 93000, 100),)
    measured = verdicts(results(ours, theirs, ceilings=ceilings), "PyTriton")
    assert measured["small HTTP c=32 p99 below PyTriton's"] is True
    assert measured["small gRPC c=32 p99 below PyTriton's"] is None
    alone = evaluate(results(ours, ceilings=ceilings))
    assert any(v.measured == "peers not run" for v in alone)


def test_c1_overhead_is_p50_minus_the_in_process_batch_1_time() -> None:
    found = results(
        point(BATCHSERVE, "small", "http", 1, 2000, p50_ms=0.40),  # 0.40 - 0.04 = 0.36
        point(BATCHSERVE, "small", "grpc", 1, 1500, p50_ms=0.60),  # 0.60 - 0.04 = 0.56
        ceilings=(CeilingPoint("small", 1, 0.00004, 2000),),
    )
    assert verdicts(found, "p50") == {
        "small HTTP c=1 p50 - in-process b=1 <= 0.35 ms": False,
        "small gRPC c=1 p50 - in-process b=1 <= 0.6 ms": True,
    }


def test_c1_overhead_over_rounds_takes_the_median_p50() -> None:
    taken = [
        replace(point(BATCHSERVE, "small", "http", 1, 2000, p50_ms=p50), round=number)
        for number, p50 in enumerate([0.50, 0.30, 0.36])  # 0.46, 0.26, 0.32 over b=1
    ]
    found = results(*taken, ceilings=(CeilingPoint("small", 1, 0.00004, 2000),))
    verdict = next(v for v in evaluate(found) if v.target.startswith("small HTTP c=1"))
    assert verdict.passed is True  # the median round, though the first alone would fail
    assert verdict.figure == pytest.approx(0.32)
    assert verdict.rounds == pytest.approx((0.46, 0.26, 0.32))
    assert verdict.measured == (
        "0.360 - 0.040 = 0.320 ms; rounds 0.460 / 0.260 / 0.320, median of 3"
    )


def test_mean_batch_target_follows_a_lower_cap() -> None:
    found = results(
        point(BATCHSERVE, "small", "http", 32, 8000, requests=2300, executions=100),
        point(BATCHSERVE, "small", "grpc", 32, 3000, requests=600, executions=100, cap=8),
    )
    assert verdicts(found, "mean batch") == {
        "small HTTP c=32 mean batch >= 0.7 x min(32, cap)": True,  # 23 >= 22.4
        "small gRPC c=32 mean batch >= 0.7 x min(32, cap)": True,  # 6 >= 0.7 x 8
    }


def test_mean_batch_is_not_asked_of_a_model_shipped_without_batching() -> None:
    found = results(point(BATCHSERVE, "plain", "http", 32, 100, batching="off"))
    found.shipped["plain"] = "off"
    assert not verdicts(found, "plain HTTP c=32 mean batch")


def test_missing_and_failed_points_are_not_measured_rather_than_failed() -> None:
    failed = ServerPoint(BATCHSERVE, "small", "http", 1, "on", None, error="x\nserver crashed\n")
    found = results(failed, ceilings=(CeilingPoint("small", 1, 0.00004, 2000),))
    by_target = {v.target: v for v in evaluate(found)}
    http = by_target["small HTTP c=1 p50 - in-process b=1 <= 0.35 ms"]
    assert (http.passed, http.measured) == (None, "point failed: server crashed")
    assert (
        by_target["small gRPC c=1 p50 - in-process b=1 <= 0.6 ms"].measured
        == "not measured in this run"
    )
    assert Verdict("t", "m", None).label == "not measured"


def test_a_model_without_ceiling_cannot_be_classified() -> None:
    found = results(point(BATCHSERVE, "small", "http", 32, 8000))
    assert compute_bound(found, "small") is None
    assert verdicts(found, "throughput") == {"small: throughput target": None}


def test_identity_through_batchserve_is_held_to_latency_and_batching_targets() -> None:
    found = results(
        point(BATCHSERVE, IDENTITY, "http", 1, 4000, p50_ms=0.2),
        point(BATCHSERVE, IDENTITY, "http", 32, 9000, requests=3200, executions=200),
        ceilings=(CeilingPoint(IDENTITY, 1, 0.00001, 2000),),
    )
    judged = {v.target: v.passed for v in evaluate(found)}
    assert judged["identity HTTP c=1 p50 - in-process b=1 <= 0.35 ms"] is True
    assert judged["identity HTTP c=32 mean batch >= 0.7 x min(32, cap)"] is False  # 16 < 22.4
    assert not any("identity" in t and "echo" in t for t in judged)


def test_negative_overhead_passes_with_a_warning() -> None:
    found = results(
        point(BATCHSERVE, "cnn", "http", 1, 30, p50_ms=30.0),
        ceilings=(CeilingPoint("cnn", 1, 0.2, 5),),
    )
    judged = {v.target: v for v in evaluate(found)}
    verdict = judged["cnn HTTP c=1 p50 - in-process b=1 <= 0.35 ms"]
    assert verdict.passed is True
    assert verdict.measured.endswith(
        "= -170.000 ms (the in-process call was the slower: see the load table)"
    )


def test_a_floor_taken_beside_the_model_is_the_one_it_is_judged_against() -> None:
    beside = [
        replace(point(AIOHTTP, IDENTITY, "http", 32, 10000), beside="small"),
        replace(point(GRPC_AIO, IDENTITY, "grpc", 32, 5000), beside="other"),
    ]
    found = results(
        *beside,
        point(BATCHSERVE, "small", "http", 32, 6500),  # 0.5 x section 13,000; 0.65 x 10,000
        point(BATCHSERVE, "small", "grpc", 32, 3200),  # 0.55 x section 5,800 (other's ignored)
        ceilings=(CeilingPoint("small", 32, 32 / 93000, 100),),
    )
    assert found.floor(AIOHTTP, "http", 32, beside="small") is beside[0]
    assert found.floor(AIOHTTP, "http", 32).throughput == 13000  # the floors section's
    assert found.floor(GRPC_AIO, "grpc", 32, beside="small").throughput == 5800
    assert verdicts(found, "echo") == {
        "small HTTP c=32 >= 0.6 x aiohttp echo": True,
        "small gRPC c=32 >= 0.6 x grpc.aio echo": False,
        "(stretch) small HTTP c=32 >= 0.6 x raw ASGI echo": False,
    }


def rounds_of(model: str, protocol: str, rates: list[tuple[float, float]]) -> list[ServerPoint]:
    """Paired rounds at c=32: (echo rate, model rate) for each round, echo first."""
    echo = {"http": AIOHTTP, "grpc": GRPC_AIO}[protocol]
    taken: list[ServerPoint] = []
    for number, (floor_rate, model_rate) in enumerate(rates):
        floor = point(echo, IDENTITY, protocol, 32, floor_rate)
        ours = point(BATCHSERVE, model, protocol, 32, model_rate, requests=2400, executions=100)
        taken += [replace(floor, beside=model, round=number), replace(ours, round=number)]
    return taken


def test_paired_rounds_are_judged_on_the_median_of_their_ratios() -> None:
    # ratios 0.55, 0.70, 0.62: the median round passes, though the first alone would fail
    http = rounds_of("small", "http", [(4000, 2200), (5000, 3500), (4500, 2790)])
    # ratios 0.50, 0.58, 0.66: the median fails, though the last alone would pass
    grpc = rounds_of("small", "grpc", [(2000, 1000), (2000, 1160), (2000, 1320)])
    found = results(*http, *grpc, ceilings=(CeilingPoint("small", 32, 32 / 93000, 100),))
    by_target = {v.target: v for v in evaluate(found)}
    on_http = by_target["small HTTP c=32 >= 0.6 x aiohttp echo"]
    assert on_http.passed is True
    assert on_http.measured == "2,790/s = 0.62 x 4,500/s; rounds 0.55 / 0.70 / 0.62, median 0.62"
    assert (on_http.figure, on_http.rounds) == (2790 / 4500, (0.55, 0.70, 2790 / 4500))
    assert by_target["small gRPC c=32 >= 0.6 x grpc.aio echo"].passed is False


def test_a_failed_round_leaves_the_others_to_judge() -> None:
    taken = rounds_of("small", "http", [(4000, 2200), (5000, 3500)])
    failed = ServerPoint(BATCHSERVE, "small", "http", 32, "on", None, error="crashed", round=2)
    found = results(*taken, failed, ceilings=(CeilingPoint("small", 32, 32 / 93000, 100),))
    target = "small HTTP c=32 >= 0.6 x aiohttp echo"
    verdict = next(v for v in evaluate(found) if v.target == target)
    # two rounds left: the lower of the middle two is the median
    assert verdict.passed is False
    assert verdict.measured == "2,200/s = 0.55 x 4,000/s; rounds 0.55 / 0.70, median 0.55"


def test_compute_bound_rounds_are_judged_against_the_ceiling_taken_beside_each() -> None:
    section = CeilingPoint("cnn", 16, 16 / 100, 5)  # 100/s, in a fast minute
    taken: list[CeilingPoint | ServerPoint] = []
    for protocol, ceilings, rates in [
        ("http", [80.0, 82.0, 90.0], [77.0, 79.0, 84.0]),  # 0.96, 0.96, 0.93 round by round
        ("grpc", [95.0, 95.0, 95.0], [80.0, 81.0, 82.0]),  # 0.84-0.86 against their own
    ]:
        for number, (ceiling, rate) in enumerate(zip(ceilings, rates, strict=True)):
            beside = CeilingPoint("cnn", 16, 16 / ceiling, 5, "cnn", protocol, number)
            ours = replace(point(BATCHSERVE, "cnn", protocol, 16, rate), round=number)
            taken += [beside, ours]
    ceilings = tuple(c for c in taken if isinstance(c, CeilingPoint))
    ours = [p for p in taken if isinstance(p, ServerPoint)]
    found = results(*ours, ceilings=(section, *ceilings))
    assert found.best_ceiling("cnn") == section
    by_target = {v.target: v for v in evaluate(found)}
    http, grpc = (by_target[f"cnn {name} c=16 >= 0.95 x ceiling"] for name in ("HTTP", "gRPC"))
    assert http.passed is True  # against the section's 100/s alone it would be 0.79
    assert http.measured.startswith("77.0/s = 0.96 x 80.0/s (b=16); rounds 0.96 / 0.96 / 0.93")
    assert grpc.passed is False
    assert grpc.measured.startswith("81.0/s = 0.85 x 95.0/s (b=16)")


def test_mean_batch_pools_rounds_and_p99_takes_their_median() -> None:
    taken = rounds_of("small", "http", [(4000, 2400), (4000, 2400), (4000, 2400)])
    p99s = iter([9.0, 30.0, 12.0])
    taken = [replace(p, row=replace(p.row, p99_us=next(p99s) * 1000)) if p.server == BATCHSERVE
             else p for p in taken]  # fmt: skip
    small_batches = replace(taken[-1], requests=600)  # 6 a batch in the last round
    taken[-1] = small_batches
    theirs = point(PYTRITON, "small", "http", 32, 2400, p99_ms=20.0)
    found = results(*taken, theirs, ceilings=(CeilingPoint("small", 32, 32 / 93000, 100),))
    by_target = {v.target: v for v in evaluate(found)}
    batch = by_target["small HTTP c=32 mean batch >= 0.7 x min(32, cap)"]
    assert (batch.passed, batch.measured) == (False, "18.0 (need 22.4; cap 64) over 3 rounds")
    tail = by_target["small HTTP c=32 p99 below PyTriton's"]
    assert (tail.passed, tail.measured) == (True, "12.00 ms vs 20.00 ms (median of 3 rounds)")
