"""bench.objective's figures, its report and its targets (plain values, no measuring)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.open_loop import WINDOWS, Figures
from bench.report import table

OBJECTIVE, DELAY_0, HALF = "objective", "delay 0", "delay objective/2"
CONFIGS = (OBJECTIVE, DELAY_0, HALF)
ECHO = "grpc.aio echo"
"""The reference played after the configs in each round: the protocol stack alone (no model,
no batching, one answer a request), given the same schedule, so that a share within the
objective can be read against what the stack itself reaches on the same cores."""
SHIPPED = "shipped"  # the model's own config, for the capacity
TARGET_LOAD, TARGET_SHARE = 0.8, 0.99
KEPT_UP_P99_MS = 100.0
"""A Poisson rate the server keeps up with answers its p99 within this: four times the
shipped queue delay of the models here (25 ms), where a queue that grows over the judged
windows reaches p99s of 0.5-4 s (bench/NOTES.md, seventeenth round)."""
BEHIND = 0.9
"""perf_analyzer sent less than this share of the schedule: it waited on an overloaded server."""
COLUMNS = (
    "load", "of capacity/s", "config", "offered/s", "within", "goodput/s", "p50 ms", "p99 ms",
    "mean batch", "planned", "send lag p99 ms", "load not kept",
)  # fmt: skip
GENERATOR = (
    "a seeded Poisson schedule (bench/open_loop.py) played by perf_analyzer in asynchronous "
    "mode from --request-intervals over gRPC, batch 1 per request, each request sent at its "
    "time whether or not earlier ones have answered; latency from its send to its answer, as "
    "perf_analyzer's --profile-export-file records them; send lag: how far a send was from "
    "its schedule"
)
SIDE_BY_SIDE = (
    "each config served by its own copy of the model, the three loaded together on one "
    "server and kept warm; a load's rounds played back to back, the configs' order rotating"
)
RELOADED = (
    "one copy of the model, loaded again with each config before its run; every round "
    "covering each objective and load before the next round"
)
"""How the configs were served: ``SIDE_BY_SIDE`` now, ``RELOADED`` in runs from before."""
BY_DUE = (
    "the requests the schedule has due from {w:g} s to {end:g} s judged, after {w:g} s of "
    "warm-up: the same requests for every config"
)
BY_WINDOWS = "two {w:g} s windows judged after one of warm-up"
"""Which requests were judged: ``BY_DUE`` now; ``BY_WINDOWS`` (those sent inside
perf_analyzer's own windows, a few more or fewer from run to run) in runs from before."""


@dataclass(frozen=True)
class Cell:
    """One config's measured window at one objective and load, in one round."""

    objective_x: int
    objective_us: int
    load: float
    config: str
    round: int
    figures: Figures
    mean_batch: float
    capacity: float = 0.0
    note: str = ""
    planned: float | None = None
    """The objective's batches that went under a plan (they could wait for company) as a
    share of all it ran; None for the fixed delays, and in runs from before it was counted."""


@dataclass
class Report:
    header: list[str] = field(default_factory=list)
    command: str = ""
    quick: bool = False
    model: str = ""
    capacity: float = 0.0
    """Closed-loop: 32 clients."""
    open_share: float = 1.0
    """The share of ``capacity`` that open-loop load kept up with."""
    open_steps: list[tuple[float, float, float]] = field(default_factory=list)
    """Each share tried for ``open_share``: (share, p99 ms, offered/s)."""
    batch1_ms: float = 0.0
    """A lone request's p50: open-loop load at a low rate, no queue delay (or, in runs from
    before that was measured, ``batch1_closed_ms``)."""
    batch1_batch: float | None = None
    """The mean batch of the lone requests' run, 1 when they were alone; None in runs from
    before it was measured."""
    batch1_closed_ms: float | None = None
    """One closed-loop client's p50 (synchronous), the batch-1 latency of earlier runs."""
    batch1_server_ms: float | None = None
    """The server's own mean time for the lone requests (Triton's statistics: from reading
    a request to its answer); None in runs from before it was measured."""
    window_s: float = 0.0
    generator: str = GENERATOR
    served: str = RELOADED
    judged: str = BY_WINDOWS
    cells: list[Cell] = field(default_factory=list)

    def client_share_us(self) -> int:
        """What the client and the network add to a lone request: its p50 less the server's
        own mean time for it (0 in runs from before the latter was measured)."""
        if self.batch1_server_ms is None:
            return 0
        return max(0, round((self.batch1_ms - self.batch1_server_ms) * 1000))

    def server_objective_us(self, objective_us: int) -> int:
        """The objective the objective-driven config gives the server: the server counts from
        reading a request to its answer, so the client's share is not its to spend (as the
        README advises its users)."""
        return max(1, objective_us - self.client_share_us())

    def rounds(self, x: int, load: float, config: str) -> list[Cell]:
        return [c for c in self.cells if (c.objective_x, c.load, c.config) == (x, load, config)]

    def played(self) -> tuple[str, ...]:
        """The configs, and the reference where this run played it (runs from before did not)."""
        return (*CONFIGS, ECHO) if any(c.config == ECHO for c in self.cells) else CONFIGS

    def objectives(self) -> list[int]:
        return list(dict.fromkeys(c.objective_x for c in self.cells))

    def loads(self) -> list[float]:
        return list(dict.fromkeys(c.load for c in self.cells))


def pooled(cells: Sequence[Cell]) -> Figures:
    """The rounds of one cell as one window: counts summed, the worst p99 and lag."""
    figures = [c.figures for c in cells]
    return Figures(
        requests=sum(f.requests for f in figures),
        within=sum(f.within for f in figures),
        failed=sum(f.failed for f in figures),
        seconds=sum(f.seconds for f in figures),
        p50_ms=statistics.median(f.p50_ms for f in figures) if figures else math.nan,
        p99_ms=max((f.p99_ms for f in figures), default=math.nan),
        lag_p99_ms=max((f.lag_p99_ms for f in figures), default=math.nan),
    )


def targets(report: Report) -> list[tuple[str, bool]]:
    """The issue's targets for the objective-driven dispatch, each with its verdict."""
    found = []
    for x in report.objectives():
        at = pooled(report.rounds(x, TARGET_LOAD, OBJECTIVE))
        if at.requests:
            echo = pooled(report.rounds(x, TARGET_LOAD, ECHO))
            reference = (
                f"; the {ECHO}, no model, at the same schedules: {echo.share:.2%}"
                if echo.requests
                else ""
            )
            found.append(
                (
                    f"{x}x: >= {TARGET_SHARE:.0%} within the objective at "
                    f"{TARGET_LOAD:.0%} load ({at.share:.2%}{reference})",
                    at.share >= TARGET_SHARE,
                )
            )
        for load in report.loads():
            mine = pooled(report.rounds(x, load, OBJECTIVE)).goodput
            best = max(pooled(report.rounds(x, load, c)).goodput for c in (DELAY_0, HALF))
            won, played = rounds_won(report, x, load)
            found.append(
                (
                    f"{x}x, {load:.0%} load: goodput {mine:,.0f}/s >= the better fixed "
                    f"delay's {best:,.0f}/s (round by round: {won} of {played})",
                    mine >= best,
                )
            )
    return found


def rounds_won(report: Report, x: int, load: float) -> tuple[int, int]:
    """In how many rounds of one cell the objective's goodput was at least the better fixed
    delay's in the same round, of the rounds all three configs played: beside the pooled
    verdict, which one disastrous round (a stall of the host) can decide."""
    by_round: dict[int, dict[str, float]] = {}
    for config in CONFIGS:
        for cell in report.rounds(x, load, config):
            by_round.setdefault(cell.round, {})[config] = cell.figures.goodput
    complete = [goodput for goodput in by_round.values() if len(goodput) == len(CONFIGS)]
    won = sum(g[OBJECTIVE] >= max(g[DELAY_0], g[HALF]) for g in complete)
    return won, len(complete)


def render(report: Report) -> str:
    lines = [
        f"# Latency objective: objective-driven dispatch against fixed delays ({report.model})",
        "",
    ]
    lines += [f"- {line}" for line in report.header]
    lines += [
        f"- command: `{report.command}`"
        + (" (quick: a smoke run, not figures)" if report.quick else ""),
        f"- load: {report.generator}",
        f"- capacity: {report.capacity:,.0f} requests/s closed-loop (perf_analyzer, 32 "
        f"concurrent clients, shipped config) at the start, of which open-loop Poisson load at "
        f"the shipped config kept up with {report.open_share:.0%} ({_steps(report)}); the "
        f"capacity a load is a share of is {report.open_share:.0%} of the closed-loop one "
        "measured again right before "
        + ("each round of a load; " if report.served == SIDE_BY_SIDE else "that load's runs; ")
        + f"batch-1 latency {_batch1(report)}",
        "- objective-driven: `batchserve { latency_objective_microseconds }`, the shipped "
        "queue delay, refuse_late_requests off (perf_analyzer stops at a failed request); fixed "
        f"delays without an objective; {report.served}; the same schedule for the three; "
        "a run that stopped "
        "(perf_analyzer stops at the first refusal: a full queue) counts as answering nothing "
        "within the objective; "
        + report.judged.format(w=report.window_s, end=WINDOWS * report.window_s)
        + "; rounds pooled (share and "
        "goodput over all their runs, the worst p99); mean batch over the whole run; planned: "
        "the share of the objective's batches that went under a plan, able to wait for company "
        "(the rest went without one: waiting did not pay at the arrival rate, or the batch was "
        "full)",
        "- server and load generator share the machine's cores",
    ]
    if ECHO in report.played():
        lines.append(
            f"- reference: the {ECHO} floor (bench/floors/grpc_aio.py: grpc.aio on uvloop, "
            "answering each request with its own input; no model, no batching), its own "
            "process beside the server, given each round's schedule after the three configs "
            "and judged the same way"
        )
    lines.append("")
    for x in report.objectives():
        objective_us = next(c.objective_us for c in report.cells if c.objective_x == x)
        server = (
            f" (the objective-driven config's server is given "
            f"{report.server_objective_us(objective_us) / 1000:.2f} ms)"
            if report.client_share_us()
            else ""
        )
        lines += [f"## Objective {x}x batch-1: {objective_us / 1000:.2f} ms{server}", ""]
        rows = [
            _row(load, config, report.rounds(x, load, config))
            for load in report.loads()
            for config in report.played()
        ]
        lines += [table(COLUMNS, rows, "rrlrrrrrrrrl"), ""]
    lines += ["## Targets", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in targets(report)]
    return "\n".join(lines) + "\n"


def _row(load: float, config: str, cells: Sequence[Cell]) -> tuple[str, ...]:
    """One config's row at one load: its rounds pooled."""
    f = pooled(cells)
    batch = statistics.mean(c.mean_batch for c in cells) if cells else math.nan
    shares = [c.planned for c in cells if c.planned is not None]
    planned = f"{statistics.mean(shares):.0%}" if shares else ""
    capacity = statistics.mean(c.capacity for c in cells) if cells else math.nan
    stopped = "; ".join(dict.fromkeys(c.note for c in cells if c.note))
    if not stopped and f.sent_rate < BEHIND * load * capacity:
        stopped = f"fell behind: sent {f.sent_rate / (load * capacity):.0%} of the schedule"
    label = f"{config} (reference)" if config == ECHO else config
    return (
        f"{load:.0%}", f"{capacity:,.0f}", label, f"{f.offered:,.0f}",
        f"{f.share:.2%}", f"{f.goodput:,.0f}", f"{f.p50_ms:.2f}", f"{f.p99_ms:.2f}",
        f"{batch:.1f}", planned, f"{f.lag_p99_ms:.2f}", stopped,
    )  # fmt: skip


def _batch1(report: Report) -> str:
    """What the objectives are multiples of, and how it was measured."""
    if report.batch1_batch is None or report.batch1_closed_ms is None:  # an earlier run
        return f"{report.batch1_ms:.2f} ms (p50 at one closed-loop client)"
    served = (
        ""
        if report.batch1_server_ms is None
        else f"; the server's own mean time for them {report.batch1_server_ms:.2f} ms, so "
        f"the client and the network add {report.client_share_us() / 1000:.2f} ms, which "
        "the objective-driven config's server objective leaves out"
    )
    return (
        f"{report.batch1_ms:.2f} ms: the p50 of lone requests (open-loop Poisson load at a "
        f"low rate, queue delay 0, mean batch {report.batch1_batch:.2f}, played as the loads "
        f"are){served}; one closed-loop client's p50 {report.batch1_closed_ms:.2f} ms"
    )


def _steps(report: Report) -> str:
    """The open-loop capacity's search, as text."""
    if not report.open_steps:
        return "not measured: loads are shares of the closed-loop capacity"
    tried = [
        f"{share:.0%}: p99 {p99:,.1f} ms at {offered:,.0f}/s sent"
        for share, p99, offered in report.open_steps
    ]
    return (
        f"kept up: every request answered, p99 <= {KEPT_UP_P99_MS:g} ms, the schedule sent; "
        + "; ".join(tried)
    )


def dump(report: Report) -> str:
    return json.dumps(asdict(report), indent=1, allow_nan=True)


def load(text: str) -> Report:
    """The inverse of ``dump``."""
    raw: dict[str, Any] = json.loads(text)
    cells = [Cell(**{**c, "figures": Figures(**c["figures"])}) for c in raw.pop("cells")]
    raw["open_steps"] = [tuple(step) for step in raw.get("open_steps", [])]
    return Report(**raw, cells=cells)
