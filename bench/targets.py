"""The targets of the performance issue, judged on one run's figures.

A model is judged against whichever limit binds it: compute-bound (0.95 x its in-process
ceiling, at concurrency 16) when that asks for less than the request-bound target
(0.6 x the echo floor of the protocol, at concurrency 32); otherwise request-bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    PYTRITON,
    RAW_ASGI,
    Results,
    ServerPoint,
)

CEILING_SHARE, CEILING_C = 0.95, 16
FLOOR_SHARE, FLOOR_C = 0.6, 32
OVERHEAD_MS = {"http": 0.35, "grpc": 0.6}
BATCH_SHARE, BATCH_C, BATCH_LIMIT = 0.7, 32, 32
FLOORS = {"http": AIOHTTP, "grpc": GRPC_AIO}
PROTOCOLS = ("http", "grpc")
NAMES = {"http": "HTTP", "grpc": "gRPC"}


@dataclass(frozen=True)
class Verdict:
    """One target: what it asks, what was measured, and PASS (True), FAIL or not measured."""

    target: str
    measured: str
    passed: bool | None

    @property
    def label(self) -> str:
        return {True: "PASS", False: "FAIL", None: "not measured"}[self.passed]


def evaluate(results: Results) -> list[Verdict]:
    """Every target that applies to the models of this run, in the issue's order."""
    models = results.models()
    verdicts = [v for m in models for v in _throughput(results, m)]
    verdicts += [v for m in [*models, IDENTITY] for v in _overhead(results, m)]
    verdicts += [v for m in [*models, IDENTITY] for v in _batching(results, m)]
    return verdicts


def compute_bound(results: Results, model: str) -> bool | None:
    """True when 0.95 x ceiling < 0.6 x the aiohttp floor; None when either is missing."""
    limits = bounds(results, model)
    return None if limits is None else limits[0] < limits[1]


def bounds(results: Results, model: str) -> tuple[float, float] | None:
    """(0.95 x ceiling, 0.6 x aiohttp floor at c=32) in requests/s, when both were measured."""
    best, floor = results.best_ceiling(model), results.floor(AIOHTTP, "http", FLOOR_C)
    if best is None or floor is None or floor.row is None:
        return None
    return CEILING_SHARE * best.samples_per_s, FLOOR_SHARE * floor.throughput


def _shipped(results: Results, model: str, protocol: str, concurrency: int) -> ServerPoint | None:
    server = BATCHSERVE
    return results.find(server, model, protocol, concurrency, results.shipped.get(model, "on"))


def _throughput(results: Results, model: str) -> Iterator[Verdict]:
    bound = compute_bound(results, model)
    if bound is None:
        yield Verdict(f"{model}: throughput target", "no ceiling or no aiohttp floor", None)
    elif bound:
        yield from (_vs_ceiling(results, model, p) for p in PROTOCOLS)
    else:
        yield from (_vs_floor(results, model, p, FLOORS[p], "") for p in PROTOCOLS)
        yield _vs_floor(results, model, "http", RAW_ASGI, "(stretch) ")
        yield from (_vs_pytriton(results, model, p) for p in PROTOCOLS)


def _vs_ceiling(results: Results, model: str, protocol: str) -> Verdict:
    target = f"{model} {NAMES[protocol]} c={CEILING_C} >= {CEILING_SHARE} x ceiling"
    point, best = _shipped(results, model, protocol, CEILING_C), results.best_ceiling(model)
    if point is None or point.row is None or best is None:
        return Verdict(target, _missing(point), None)
    ratio = point.throughput / best.samples_per_s
    measured = (
        f"{rate(point.throughput)}/s = {ratio:.2f} x {rate(best.samples_per_s)}/s (b={best.batch})"
    )
    return Verdict(target, measured, ratio >= CEILING_SHARE)


def _vs_floor(results: Results, model: str, protocol: str, server: str, prefix: str) -> Verdict:
    target = f"{prefix}{model} {NAMES[protocol]} c={FLOOR_C} >= {FLOOR_SHARE} x {server}"
    point, floor = (
        _shipped(results, model, protocol, FLOOR_C),
        results.floor(server, protocol, FLOOR_C, beside=model),
    )
    if floor is None or floor.row is None:
        return Verdict(target, f"no {server} point at c={FLOOR_C}", None)
    if point is None or point.row is None:
        return Verdict(target, _missing(point), None)
    ratio = point.throughput / floor.throughput
    measured = f"{rate(point.throughput)}/s = {ratio:.2f} x {rate(floor.throughput)}/s"
    return Verdict(target, measured, ratio >= FLOOR_SHARE)


def _vs_pytriton(results: Results, model: str, protocol: str) -> Verdict:
    target = f"{model} {NAMES[protocol]} c={FLOOR_C} p99 below PyTriton's"
    peer = results.find(PYTRITON, model, protocol, FLOOR_C)
    point = _shipped(results, model, protocol, FLOOR_C)
    if peer is None or peer.row is None or point is None or point.row is None:
        return Verdict(target, "peers not run" if peer is None else _missing(peer), None)
    measured = f"{point.row.p99_us / 1000:.2f} ms vs {peer.row.p99_us / 1000:.2f} ms"
    return Verdict(target, measured, point.row.p99_us < peer.row.p99_us)


def _overhead(results: Results, model: str) -> Iterator[Verdict]:
    for protocol in PROTOCOLS:
        limit = OVERHEAD_MS[protocol]
        target = f"{model} {NAMES[protocol]} c=1 p50 - in-process b=1 <= {limit} ms"
        point, alone = _shipped(results, model, protocol, 1), results.ceiling(model, 1)
        if point is None or point.row is None or alone is None:
            yield Verdict(target, _missing(point) if alone else "no in-process b=1", None)
            continue
        extra_ms = point.row.p50_us / 1000 - alone.median_s * 1000
        measured = (
            f"{point.row.p50_us / 1000:.3f} - {alone.median_s * 1000:.3f} = {extra_ms:.3f} ms"
        )
        if extra_ms < 0:
            measured += " (the in-process call was the slower: see the load table)"
        yield Verdict(target, measured, extra_ms <= limit)


def _batching(results: Results, model: str) -> Iterator[Verdict]:
    if results.shipped.get(model, "on") != "on":
        return
    for protocol in PROTOCOLS:
        point = _shipped(results, model, protocol, BATCH_C)
        cap = min(BATCH_LIMIT, point.cap or BATCH_LIMIT) if point else BATCH_LIMIT
        need = BATCH_SHARE * cap
        target = f"{model} {NAMES[protocol]} c={BATCH_C} mean batch >= {BATCH_SHARE} x min(32, cap)"
        if point is None or point.row is None or not point.executions:
            yield Verdict(target, _missing(point), None)
            continue
        measured = f"{point.mean_batch:.1f} (need {need:.1f}; cap {point.cap or 'unknown'})"
        yield Verdict(target, measured, point.mean_batch >= need)


def _missing(point: ServerPoint | None) -> str:
    if point is None:
        return "not measured in this run"
    return f"point failed: {last_line(point.error)}"


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def rate(value: float) -> str:
    """Requests or samples per second: thousands separated, one decimal below 100."""
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
