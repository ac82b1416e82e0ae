"""bench/MEASURED_DEFAULTS.md from one run's figures: what each load chose, the paired rounds
and the targets of the measured defaults. Pure: judging, formatting and the JSON beside it.

Each model is served under one name per config: its own name where the load measures (no
instance count, no thread parameter), ``_old_default`` with ``instance_group [{ count: 1 }]``
(what such a config got before), ``_hand_tuned`` with one single-threaded instance per core.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from batchserve.models.measured_defaults import Setting

from bench import records
from bench.records import BATCHSERVE, Results, ServerPoint
from bench.report import heading, loads, ms, ratio, table
from bench.targets import (
    CEILING_C,
    CEILING_SHARE,
    NAMES,
    Pair,
    Verdict,
    ceiling_of,
    ceiling_pairs,
    last_line,
    paired,
    rate,
)

MEASURED, OLD, TUNED = "measured default", "old default", "hand-tuned"
SUFFIXES = {MEASURED: "", OLD: "_old_default", TUNED: "_hand_tuned"}
CNN_VARIANTS = (OLD, MEASURED, TUNED)
LIGHT_SHARE = 0.97
"""A light model's measured default against the old one: "loses nothing" within the noise
of a pair of windows on a shared 2-core machine (a few per cent)."""
LIGHT_POINTS = (("grpc", 16), ("http", 32))


def served(model: str, variant: str) -> str:
    """The name ``model`` is served under with ``variant``'s config."""
    return model + SUFFIXES[variant]


@dataclass(frozen=True)
class Choice:
    """What a load chose by measurement: the statistics' ``batchserve.measured_defaults``.

    Args:
        measured: each setting measured, its samples/s and its error ("" when it ran).
    """

    chosen: str
    reason: str
    seconds: float
    measured: tuple[tuple[str, float, str], ...] = ()

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> Choice | None:
        """From one model's v2 statistics (HTTP JSON); None where the load measured nothing."""
        found = stats.get("batchserve", {}).get("measured_defaults")
        if found is None:
            return None
        measured = tuple(
            (_setting(m), float(m.get("samples_per_second", 0.0)), str(m.get("error", "")))
            for m in found.get("measured", [])
        )
        return cls(_setting(found["chosen"]), found["reason"], float(found["seconds"]), measured)


def _setting(entry: Mapping[str, Any]) -> str:
    """The server's own words for a setting (``Setting.__str__``)."""
    return str(
        Setting(
            instances=int(entry.get("instances", 1)),
            threads=int(entry.get("threads", 0)),
            cuda_graphs=bool(entry.get("cuda_graphs", False)),
            cpu_instances=int(entry.get("cpu_instances", 0)),
        )
    )


@dataclass
class Run:
    """One run: every figure (``bench.records``), which models are compute-bound CNNs and
    which light, and what each load chose, by served name (None: the config set its own)."""

    results: Results
    cnns: list[str] = field(default_factory=list)
    light: list[str] = field(default_factory=list)
    choices: dict[str, Choice | None] = field(default_factory=dict)
    cores: int = 0


def dump(run: Run) -> str:
    """Every figure of a run as JSON, so that the report can be rendered again (--rerender)."""
    raw = asdict(run)
    return json.dumps(raw, indent=1, allow_nan=True)


def load(text: str) -> Run:
    """The inverse of ``dump``."""
    raw: dict[str, Any] = json.loads(text)
    results = records.load(json.dumps(raw.pop("results")))
    choices = {
        name: None if c is None else Choice(**{**c, "measured": tuple(map(tuple, c["measured"]))})
        for name, c in raw.pop("choices").items()
    }
    return Run(results, choices=choices, **raw)


def light_pairs(results: Results, model: str, protocol: str, concurrency: int) -> list[Pair]:
    """Each round of the measured default's point with the old default's of the same round."""
    old = {
        p.round: p
        for p in results.rounds(BATCHSERVE, served(model, OLD), protocol, concurrency)
        if p.row is not None
    }
    return [
        Pair(p, old[p.round].throughput)
        for p in results.rounds(BATCHSERVE, model, protocol, concurrency)
        if p.row is not None and p.round in old
    ]


def verdicts(run: Run) -> list[Verdict]:
    """The targets: each CNN's measured default >= 0.95 x its ceiling at gRPC c=16; each light
    model's measured default >= LIGHT_SHARE x the old default at every point."""
    found = [_cnn_verdict(run.results, model) for model in run.cnns]
    for model in run.light:
        for protocol, concurrency in LIGHT_POINTS:
            found.append(_light_verdict(run.results, model, protocol, concurrency))
    return found


def _cnn_verdict(results: Results, model: str) -> Verdict:
    target = f"{model} {NAMES['grpc']} c={CEILING_C}, {MEASURED} >= {CEILING_SHARE} x ceiling"
    pairs, best = ceiling_pairs(results, model, "grpc"), results.best_ceiling(model)
    if not pairs or best is None:
        return Verdict(target, _missing(results, [model], "grpc", CEILING_C), None)
    return paired(target, pairs, CEILING_SHARE, f" (b={best.batch})")


def _light_verdict(results: Results, model: str, protocol: str, concurrency: int) -> Verdict:
    target = (
        f"{model} {NAMES[protocol]} c={concurrency}, {MEASURED} >= {LIGHT_SHARE} x {OLD} "
        "(within noise)"
    )
    pairs = light_pairs(results, model, protocol, concurrency)
    if not pairs:
        failed = _missing(results, [model, served(model, OLD)], protocol, concurrency)
        return Verdict(target, failed, None)
    return paired(target, pairs, LIGHT_SHARE)


def _missing(results: Results, names: Sequence[str], protocol: str, concurrency: int) -> str:
    """Why a target has no pair: the first point among ``names`` there that failed, if any."""
    where = (protocol, concurrency)
    failed = [
        p
        for p in results.points
        if p.row is None and p.model in names and (p.protocol, p.concurrency) == where
    ]
    return f"point failed: {last_line(failed[0].error)}" if failed else "not measured"


def render(run: Run, found: Sequence[Verdict]) -> str:
    parts = [
        heading(
            "# Measured defaults: instances and threads chosen at load, against the old default",
            run.results,
            "rounds",
        ),
        _choices(run),
        _cnns(run),
        _light(run),
        "## Targets\n\n"
        + table(("target", "measured", "result"), [_verdict_row(v) for v in found], "lll"),
        loads(run.results),
        _notes(run),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def _verdict_row(v: Verdict) -> tuple[str, str, str]:
    return (v.target, v.measured, f"**{v.label}**")


def _choices(run: Run) -> str:
    rows = []
    for model in [*run.cnns, *run.light]:
        choice = run.choices.get(model)
        if choice is None:
            rows.append([model, "not measured: the config set instances or threads", "", "", ""])
            continue
        figures = "; ".join(
            f"{setting}: {error or rate(speed) + '/s'}" for setting, speed, error in choice.measured
        )
        rows.append([model, choice.chosen, choice.reason, f"{choice.seconds:.1f}", figures])
    header = ("model", "chosen", "why", "measuring s", "samples/s measured at load")
    title = (
        "## What each load chose\n\n"
        "From the model's statistics (`batchserve.measured_defaults` in "
        "`GET /v2/models/<model>/stats`); measuring s is the time the load spent choosing."
    )
    return f"{title}\n\n" + table(header, rows, "lllrl")


def _cnns(run: Run) -> str:
    if not run.cnns:
        return ""
    results, summary = run.results, []
    for model in run.cnns:
        best = results.best_ceiling(model)
        shown = f"{rate(best.samples_per_s)} (b={best.batch})" if best else "—"
        ratios = [_median_ratio(ceiling_pairs(results, served(model, v), "grpc")) for v in
                  CNN_VARIANTS]  # fmt: skip
        summary.append([model, shown, *ratios])
    variants = {served(m, v): (m, v) for m in run.cnns for v in CNN_VARIANTS}
    rows = [
        _cnn_row(results, p, *variants[p.model])
        for p in results.points
        if p.model in variants and (p.protocol, p.concurrency) == ("grpc", CEILING_C)
    ]
    title = (
        f"## Compute-bound CNNs: gRPC c={CEILING_C} against the in-process ceiling\n\n"
        f"The median over rounds of throughput ÷ the ceiling taken right before it (range in "
        f"brackets). {OLD}: `instance_group [{{ count: 1 }}]`, the runtime's threads; "
        f"{MEASURED}: no count, no threads (the load measures); {TUNED}: one instance per "
        f"core ({run.cores} here) x one thread."
    )
    header = ("model", "ceiling (section's best)", *(f"{v} ÷ ceiling" for v in CNN_VARIANTS))
    per_round = ("model", "config", "round", "ceiling samples/s (b)", "infer/s", "÷ ceiling",
                 "p99 ms", "mean batch", "server CPU ms/req", "load1")  # fmt: skip
    return "\n\n".join([
        title,
        table(header, summary, "lrrrr"),
        "Every round, in the order taken (the configs' order reverses every other round):",
        table(per_round, rows, "llr" + "r" * 7),
    ])  # fmt: skip


def _cnn_row(results: Results, p: ServerPoint, model: str, variant: str) -> list[str]:
    ceiling = ceiling_of(results, p)
    speed = ceiling.samples_per_s if ceiling else None
    shown = f"{rate(ceiling.samples_per_s)} ({ceiling.batch})" if ceiling else "—"
    p99 = ms(p.row.p99_us) if p.row else "—"
    return [
        model, variant, str(p.round + 1), shown, _throughput(p), ratio(p.throughput, speed),
        p99, _mean_batch(p), _cpu_ms(p), f"{p.load1:.2f}",
    ]  # fmt: skip


def _light(run: Run) -> str:
    if not run.light:
        return ""
    results, summary, rows = run.results, [], []
    for model in run.light:
        for protocol, concurrency in LIGHT_POINTS:
            point = f"{NAMES[protocol]} c={concurrency}"
            pairs = light_pairs(results, model, protocol, concurrency)
            old = [pair.reference for pair in pairs]
            new = [pair.point.throughput for pair in pairs]
            summary.append([model, point, _median(old), _median(new), _median_ratio(pairs)])
            rows += [
                [model, point, str(pair.point.round + 1), rate(pair.reference),
                 rate(pair.point.throughput), f"{pair.ratio:.2f}", f"{pair.point.load1:.2f}"]
                for pair in pairs
            ]  # fmt: skip
    title = (
        f"## Light models: {MEASURED} against the {OLD}\n\n"
        f"Both configs from one server, taking turns in each round (the {OLD} first in odd "
        "rounds); infer/s are medians over the rounds, the ratio the median of each round's."
    )
    header = ("model", "point", f"{OLD} infer/s", f"{MEASURED} infer/s", "measured ÷ old")
    per_round = ("model", "point", "round", f"{OLD} infer/s", f"{MEASURED} infer/s", "ratio",
                 "load1")  # fmt: skip
    return (
        f"{title}\n\n"
        + table(header, summary, "llrrr")
        + "\n\nEvery round:\n\n"
        + table(per_round, rows, "llrrrrr")
    )


def _throughput(p: ServerPoint) -> str:
    if p.row is None:
        return "failed"
    return rate(p.row.throughput) + ("" if p.row.stable else "*")


def _mean_batch(p: ServerPoint) -> str:
    return "—" if math.isnan(p.mean_batch) else f"{p.mean_batch:.1f}"


def _cpu_ms(p: ServerPoint) -> str:
    return "—" if math.isnan(p.cpu_us_per_request) else f"{p.cpu_us_per_request / 1000:.1f}"


def _median(values: Sequence[float]) -> str:
    return rate(statistics.median(values)) if values else "—"


def _median_ratio(pairs: Sequence[Pair]) -> str:
    ratios = [pair.ratio for pair in pairs if math.isfinite(pair.ratio)]
    if not ratios:
        return "—"
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}{spread}"


def _notes(run: Run) -> str:
    notes = list(run.results.notes)
    if any(p.row and not p.row.stable for p in run.results.points):
        notes.append(
            "Figures marked * did not settle within perf_analyzer's 25 % stability and were "
            "taken again at 100 %."
        )
    notes += [
        f"Failed: {p.model} {NAMES[p.protocol]} c={p.concurrency} round {p.round + 1}: "
        f"{last_line(p.error)}"
        for p in run.results.points
        if p.row is None
    ]
    return "## Notes\n\n" + "\n".join(f"- {note}" for note in notes)
