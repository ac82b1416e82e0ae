"""The targets of the performance issue, judged on one run's figures.

A model is judged against whichever limit binds it: compute-bound (0.95 x its in-process
ceiling, at concurrency 16) when that asks for less than the request-bound target
(0.6 x the echo floor of the protocol, at concurrency 32); otherwise request-bound.
A throughput ratio is the median over paired rounds (the model's point and its reference
taken seconds apart) when the run took several: one pair alone moves with the minute.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    PYTRITON,
    RAW_ASGI,
    CeilingPoint,
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
    """One target: what it asks, what was measured, and PASS (True), FAIL or not measured.

    ``figure`` is the number judged (a ratio, milliseconds or a mean batch) and ``rounds``
    the same figure in each paired round, so that two runs can be compared
    (`python -m bench.compare`) without parsing ``measured``.
    """

    target: str
    measured: str
    passed: bool | None
    figure: float | None = None
    rounds: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        return {True: "PASS", False: "FAIL", None: "not measured"}[self.passed]


@dataclass(frozen=True)
class Pair:
    """One round of a throughput target: the model's point and the rate it is judged against."""

    point: ServerPoint
    reference: float

    @property
    def ratio(self) -> float:
        return self.point.throughput / self.reference


def median_pair(pairs: Sequence[Pair]) -> Pair:
    """The round whose ratio is the median (the lower of the middle two for an even count)."""
    ordered = sorted(pairs, key=lambda pair: pair.ratio)
    return ordered[(len(ordered) - 1) // 2]


def floor_pairs(results: Results, model: str, protocol: str, server: str) -> list[Pair]:
    """Each measured round of the model's c=32 point with the echo point taken beside it."""
    pairs = []
    for point in _rounds(results, model, protocol, FLOOR_C):
        floor = results.floor(server, protocol, FLOOR_C, beside=model, round_=point.round)
        if point.row is not None and floor is not None and floor.row is not None:
            pairs.append(Pair(point, floor.throughput))
    return pairs


def ceiling_pairs(results: Results, model: str, protocol: str) -> list[Pair]:
    """Each measured round of the model's c=16 point with the ceiling it is judged against."""
    pairs = []
    for point in _rounds(results, model, protocol, CEILING_C):
        reference = ceiling_of(results, point)
        if point.row is not None and reference is not None:
            pairs.append(Pair(point, reference.samples_per_s))
    return pairs


def ceiling_of(results: Results, point: ServerPoint) -> CeilingPoint | None:
    """The ceiling a batchserve point is compared with: the one taken right before it for a
    round of the shipped variant at c=16, else the ceiling section's best."""
    paired = (
        point.server == BATCHSERVE
        and point.concurrency == CEILING_C
        and point.batching == results.shipped.get(point.model, "on")
    )
    beside = results.ceiling_beside(point.model, point.protocol, point.round) if paired else None
    return beside or results.best_ceiling(point.model)


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
    found = _rounds(results, model, protocol, concurrency)
    return found[0] if found else None


def _rounds(results: Results, model: str, protocol: str, concurrency: int) -> list[ServerPoint]:
    batching = results.shipped.get(model, "on")
    return results.rounds(BATCHSERVE, model, protocol, concurrency, batching)


def paired(target: str, pairs: Sequence[Pair], share: float, reference_note: str = "") -> Verdict:
    """The median round's figures, every round's ratio when there were several, the verdict."""
    middle = median_pair(pairs)
    measured = (
        f"{rate(middle.point.throughput)}/s = {middle.ratio:.2f} x "
        f"{rate(middle.reference)}/s{reference_note}"
    )
    ratios = tuple(pair.ratio for pair in pairs)
    if len(pairs) > 1:
        shown = " / ".join(f"{ratio:.2f}" for ratio in ratios)
        measured += f"; rounds {shown}, median {middle.ratio:.2f}"
    return Verdict(target, measured, middle.ratio >= share, middle.ratio, ratios)


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
    pairs, best = ceiling_pairs(results, model, protocol), results.best_ceiling(model)
    if not pairs or best is None:
        return Verdict(target, _missing(_shipped(results, model, protocol, CEILING_C)), None)
    return paired(target, pairs, CEILING_SHARE, f" (b={best.batch})")


def _vs_floor(results: Results, model: str, protocol: str, server: str, prefix: str) -> Verdict:
    target = f"{prefix}{model} {NAMES[protocol]} c={FLOOR_C} >= {FLOOR_SHARE} x {server}"
    floor = results.floor(server, protocol, FLOOR_C, beside=model)
    if floor is None or floor.row is None:
        return Verdict(target, f"no {server} point at c={FLOOR_C}", None)
    pairs = floor_pairs(results, model, protocol, server)
    if not pairs:
        return Verdict(target, _missing(_shipped(results, model, protocol, FLOOR_C)), None)
    return paired(target, pairs, FLOOR_SHARE)


def _vs_pytriton(results: Results, model: str, protocol: str) -> Verdict:
    target = f"{model} {NAMES[protocol]} c={FLOOR_C} p99 below PyTriton's"
    peer = results.find(PYTRITON, model, protocol, FLOOR_C)
    ours = [p.row.p99_us for p in _rounds(results, model, protocol, FLOOR_C) if p.row]
    if peer is None:
        return Verdict(target, "peers not run", None)
    if peer.row is None or not ours:
        failed = _shipped(results, model, protocol, FLOOR_C) if peer.row else peer
        return Verdict(target, _missing(failed), None)
    p99_us = statistics.median_low(ours)
    measured = f"{p99_us / 1000:.2f} ms vs {peer.row.p99_us / 1000:.2f} ms"
    if len(ours) > 1:
        measured += f" (median of {len(ours)} rounds)"
    rounds = tuple(p99 / 1000 for p99 in ours)
    return Verdict(target, measured, p99_us < peer.row.p99_us, p99_us / 1000, rounds)


def _overhead(results: Results, model: str) -> Iterator[Verdict]:
    for protocol in PROTOCOLS:
        limit = OVERHEAD_MS[protocol]
        target = f"{model} {NAMES[protocol]} c=1 p50 - in-process b=1 <= {limit} ms"
        taken, alone = _rounds(results, model, protocol, 1), results.ceiling(model, 1)
        p50s_ms = [p.row.p50_us / 1000 for p in taken if p.row]
        if not p50s_ms or alone is None:
            failed = taken[0] if taken else None
            yield Verdict(target, _missing(failed) if alone else "no in-process b=1", None)
            continue
        alone_ms = alone.median_s * 1000
        rounds = tuple(p50 - alone_ms for p50 in p50s_ms)
        extra_ms = statistics.median_low(rounds)
        measured = f"{extra_ms + alone_ms:.3f} - {alone_ms:.3f} = {extra_ms:.3f} ms"
        if len(rounds) > 1:
            shown = " / ".join(f"{extra:.3f}" for extra in rounds)
            measured += f"; rounds {shown}, median of {len(rounds)}"
        if extra_ms < 0:
            measured += " (the in-process call was the slower: see the load table)"
        yield Verdict(target, measured, extra_ms <= limit, extra_ms, rounds)


def _batching(results: Results, model: str) -> Iterator[Verdict]:
    if results.shipped.get(model, "on") != "on":
        return
    for protocol in PROTOCOLS:
        measured_rounds = [p for p in _rounds(results, model, protocol, BATCH_C) if p.row]
        point = measured_rounds[0] if measured_rounds else None
        cap = min(BATCH_LIMIT, point.cap or BATCH_LIMIT) if point else BATCH_LIMIT
        need = BATCH_SHARE * cap
        target = f"{model} {NAMES[protocol]} c={BATCH_C} mean batch >= {BATCH_SHARE} x min(32, cap)"
        executions = sum(p.executions for p in measured_rounds)
        if point is None or not executions:
            yield Verdict(target, _missing(_shipped(results, model, protocol, BATCH_C)), None)
            continue
        mean = sum(p.requests for p in measured_rounds) / executions
        measured = f"{mean:.1f} (need {need:.1f}; cap {point.cap or 'unknown'})"
        if len(measured_rounds) > 1:
            measured += f" over {len(measured_rounds)} rounds"
        means = tuple(p.mean_batch for p in measured_rounds if p.executions)
        yield Verdict(target, measured, mean >= need, mean, means)


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
