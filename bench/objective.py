"""Objective-driven dispatch against fixed queue delays, under open-loop Poisson load.

    python -m bench.objective [--quick] [--model digits_cnn] [--loads 0.5,0.8,0.95]
        [--objectives 3,10] [--window-s 5] [--rounds 2] [--out bench/OBJECTIVE.md]

One server (`batchserve serve`) over a scratch repository that holds the model four times:
as shipped, and once for each of the three configs compared (``CONFIGS``): the
objective-driven dispatch (``batchserve { latency_objective_microseconds }``, the queue delay
as shipped, ``refuse_late_requests`` off) and fixed queue delays of 0 and of half the
objective, without an objective. First the closed-loop capacity of the shipped copy
(saturated throughput: perf_analyzer at 32 concurrent gRPC clients), the share of it that
open-loop Poisson load keeps up with (``open_share``), which makes the capacity the loads
are shares of, and the batch-1 latency (the p50 of lone requests, on the delay-0 copy).
Then, for each objective (a multiple of the batch-1 latency), the objective's two copies
are loaded with it (repository load API, config override), and for each load the same
Poisson schedule (``open_loop.py``) is played to the three copies in turn, round after
round before the next load: the three stay loaded and warm, and the runs compared are about
a minute apart, not a sweep apart (``bench/NOTES.md``, thirty-eighth round: no reloads,
though the host's swings within a minute still decide single runs). Each run starts once
the server has settled from the one before (``settle``). A run's first window is a
warm-up; over the requests the schedule has due in the two after it (the same requests for
every config, ``open_loop.judged_span``), the share answered within the objective and the
goodput (requests per second answered within it). The configs take turns first,
second and third from round to round and load to load (each takes each place equally often
over three rounds), and rounds are pooled. After them, each round plays the same schedule to
a reference in its own process: the grpc.aio echo floor (``bench/floors/grpc_aio.py``: the
protocol stack alone, no model, no batching), which says what share within the objective the
stack itself reaches at that rate on the same cores. Writes the report and, beside it, its
figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import json_format, text_format

from bench import machine, open_loop, perf, servers
from bench.common import ROOT, metric_total
from bench.objective_report import (
    BEHIND,
    BY_DUE,
    CONFIGS,
    DELAY_0,
    ECHO,
    HALF,
    KEPT_UP_P99_MS,
    OBJECTIVE,
    SHIPPED,
    SIDE_BY_SIDE,
    Cell,
    Report,
    dump,
    render,
)
from bench.objective_report import load as load_report
from bench.open_loop import Figures
from bench.records import PaRow

CAPACITY_CLIENTS = 32
LONE_RATE = 20.0
"""Requests a second of the open-loop load that measures a lone request's latency: one
every 50 ms on average, some 20 times the latency of a batch of one here, so that nearly
every request runs as a batch of one on a server that has gone idle since the last."""
OPEN_STEPS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""Shares of the closed-loop capacity tried, in turn, for the open-loop capacity."""
ECHO_MODULE, ECHO_MODEL = "bench.floors.grpc_aio", "identity"
QUIET_S = 0.5
"""Time without a new inference after which the server counts as idle between runs."""
SETTLE_LIMIT_S = 60.0
"""The longest a run waits for the one before to settle."""


@dataclass(frozen=True)
class Plan:
    """What one run measures, and for how long."""

    loads: tuple[float, ...] = (0.5, 0.8, 0.95)
    objectives: tuple[int, ...] = (3, 10)
    window_s: float = 5.0
    rounds: int = 2
    closed_s: float = 4.0  # each of perf_analyzer's windows at c=32 and c=1
    probe_window_s: float = 5.0  # each window of an open-loop capacity step (with 2 s, a
    # backlog growing at 100 % of the closed-loop capacity stayed under the p99 bound, and
    # every config then fell behind at 80 % of it)
    quick: bool = False


COPY_SUFFIXES = {OBJECTIVE: "objective", DELAY_0: "delay0", HALF: "half"}
"""The model's copy serving each of ``CONFIGS``: its name is the model's and this."""


def copy_name(model: str, config: str) -> str:
    """The name of ``model``'s copy serving ``config`` (``model`` itself for ``SHIPPED``)."""
    return model if config == SHIPPED else f"{model}_{COPY_SUFFIXES[config]}"


def override(shipped: ModelConfig, config: str, objective_us: int) -> str:
    """The JSON config a load sends for the copy serving one of ``CONFIGS`` (the shipped one
    changed, under the copy's name), or for ``SHIPPED`` (unchanged: the capacity's)."""
    changed = ModelConfig()
    changed.CopyFrom(shipped)
    changed.name = copy_name(shipped.name, config)
    if config == OBJECTIVE:
        changed.batchserve.latency_objective_microseconds = objective_us
    elif config != SHIPPED:
        if changed.HasField("batchserve"):
            changed.batchserve.ClearField("latency_objective_microseconds")
            changed.batchserve.ClearField("refuse_late_requests")
        delay = 0 if config == DELAY_0 else objective_us // 2
        changed.dynamic_batching.max_queue_delay_microseconds = delay
    return json_format.MessageToJson(changed, preserving_proto_field_name=True)


def scratch_repository(model_dir: Path, root: Path) -> Path:
    """A repository under ``root`` holding ``model_dir`` as it ships and a copy of it for
    each of ``CONFIGS`` (its files; the copy's config is given when it is loaded)."""
    repository = root / "repository"
    shutil.copytree(model_dir, repository / model_dir.name)
    for config in CONFIGS:
        copy = repository / copy_name(model_dir.name, config)
        shutil.copytree(model_dir, copy)
        renamed = load_pbtxt(copy / CONFIG_FILENAME)
        renamed.name = copy.name
        (copy / CONFIG_FILENAME).write_text(text_format.MessageToString(renamed))
    return repository


@dataclass(frozen=True)
class Target:
    """The server under measurement, its model as shipped, and a scratch directory."""

    running: servers.Running
    model: str
    shipped: ModelConfig
    work: Path
    echo: servers.Running
    """The reference (``ECHO``), a process of its own beside the server."""

    def inferences(self) -> int:
        """Inferences run so far by the shipped model, every config's copy and the echo."""
        names = [copy_name(self.model, config) for config in (SHIPPED, *CONFIGS)]
        served = sum(self.running.counts(name).inferences for name in names)
        return served + self.echo.counts(ECHO_MODEL).inferences

    def served_by(self, config: str) -> tuple[servers.Running, str]:
        """The server and the model name that one of ``CONFIGS``, ``SHIPPED`` or ``ECHO``
        is played to."""
        if config == ECHO:
            return self.echo, ECHO_MODEL
        return self.running, copy_name(self.model, config)

    def closed_loop(self, clients: int, seconds: float) -> PaRow:
        """perf_analyzer's point at ``clients`` concurrent clients (gRPC, batch 1), on the
        shipped model."""
        settings = perf.PaSettings(round(seconds * 1000), stability=100, max_trials=3)
        url = self.running.url("grpc")
        row, error = perf.run(self.model, "grpc", url, clients, settings, self.work)
        if row is None:
            raise RuntimeError(f"perf_analyzer failed at c={clients}: {error}")
        return row

    def reload(self, config: str, objective_us: int) -> None:
        """Load the copy serving one of ``CONFIGS`` (or the shipped model, for ``SHIPPED``)
        again, with its config for ``objective_us``, through the repository load API."""
        text = override(self.shipped, config, objective_us)
        body = json.dumps({"parameters": {"config": text}}).encode()
        port, name = self.running.ports["http"], copy_name(self.model, config)
        url = f"http://127.0.0.1:{port}/v2/repository/models/{name}/load"
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    @staticmethod
    def planned_batches(running: servers.Running, name: str) -> tuple[float, float]:
        """The batches model ``name``'s objective has sent so far (planned, direct): none for
        a fixed delay (the metric is the objective's only) or a server without metrics."""
        if "metrics" not in running.ports:
            return 0.0, 0.0
        port, metric = running.ports["metrics"], "batchserve_objective_batches_total"
        return (
            metric_total(port, metric, model=name, dispatch="planned"),
            metric_total(port, metric, model=name, dispatch="direct"),
        )

    def window(
        self, config: str, rate: float, seed: int, objective_s: float, window_s: float
    ) -> tuple[Figures, float, float | None, str]:
        """Open-loop Poisson load at ``rate`` on the copy serving ``config`` (or the echo):
        the figures of the windows after the first, the mean batch and the share of batches
        planned (None without an objective) over the whole run, and why it stopped early (""
        when it did not)."""
        running, name = self.served_by(config)
        span = open_loop.WINDOWS * window_s * 1.5 + 5  # perf_analyzer's ramp and slack
        due = open_loop.poisson_schedule(rate, span, seed)
        before = running.counts(name)
        planned_before = self.planned_batches(running, name)
        url = running.url("grpc")
        start_s, end_s = open_loop.judged_span(window_s)
        try:
            samples = open_loop.play(url, name, due, window_s, self.work)
        except open_loop.Stopped as stopped:
            judged = open_loop.unanswered(due, start_s, end_s)
            errors = [line for line in str(stopped).splitlines() if "error" in line]
            judged_note = (errors or ["perf_analyzer stopped"])[0].strip()
        else:
            judged = open_loop.judge(samples, objective_s, start_s, end_s)
            judged_note = ""
        after = running.counts(name)
        executions = after.executions - before.executions
        batch = (after.inferences - before.inferences) / executions if executions else 0.0
        planned, direct = (
            a - b for a, b in zip(self.planned_batches(running, name), planned_before, strict=True)
        )
        share = planned / (planned + direct) if planned + direct else None
        return judged, batch, share, judged_note


def kept_up(figures: Figures, rate: float) -> bool:
    """The server kept up with a Poisson load of ``rate``: every request answered, the p99
    bounded, and perf_analyzer able to send the schedule."""
    return (
        figures.failed == 0
        and figures.p99_ms <= KEPT_UP_P99_MS
        and figures.sent_rate >= BEHIND * rate
    )


def open_share(
    probe: Callable[[float], Figures], closed: float
) -> tuple[float, list[tuple[float, float, float]]]:
    """The open-loop capacity as a share of the closed-loop one (``closed``): the largest of
    ``OPEN_STEPS`` whose Poisson rate the server keeps up with, tried in turn up to the
    first it does not (the first step when none is kept up); and each step tried as (share,
    p99 ms, sent/s).

    Closed-loop clients pace their requests to the answers, so 32 of them measure what the
    server does with batches the clients fill; Poisson arrivals come whether or not it is
    ready, and the load generator's asynchronous sends cost the shared cores more."""
    share, tried = OPEN_STEPS[0], []
    for step in OPEN_STEPS:
        figures = probe(step * closed)
        tried.append((step, figures.p99_ms, figures.sent_rate))
        if not kept_up(figures, step * closed):
            break
        share = step
    return share, tried


def _baseline(target: Target, report: Report, setup: Plan) -> None:
    """Capacity (32 closed-loop clients), batch-1 latency, and the share of the capacity
    that open-loop load keeps up with, with the shipped config.

    The batch-1 latency the objectives are multiples of is a lone request's, as the load's
    own client sees it: the p50 of open-loop Poisson load at ``LONE_RATE`` with no queue
    delay, played by perf_analyzer in asynchronous mode like every judged load. One
    closed-loop client's p50 (synchronous, each request sent as the last is answered) is
    recorded beside it; it came out 1.1-2.3 ms where the lone request's was 2.4-2.7 ms, so an
    objective of three times it sat below what half the requests took on an idle server
    (bench/NOTES.md, thirty-fifth round). The server's own mean time for the lone requests
    is kept too: what the client and the network add is what the objective-driven config's
    server is not given (``Report.server_objective_us``)."""
    report.capacity = target.closed_loop(CAPACITY_CLIENTS, setup.closed_s).throughput
    report.batch1_closed_ms = target.closed_loop(1, setup.closed_s).p50_us / 1000
    target.reload(DELAY_0, 0)  # and so it stays: delay 0 is the same for every objective
    settle(target.inferences)
    lone_model = copy_name(target.model, DELAY_0)
    before = target.running.counts(lone_model)
    lone, batch, _, stopped = target.window(DELAY_0, LONE_RATE, 1, 1.0, setup.window_s)
    after = target.running.counts(lone_model)  # the 1 s objective above is not judged
    if stopped or after.succeeded == before.succeeded:
        raise RuntimeError(f"the lone requests' load: {stopped or 'no request succeeded'}")
    report.batch1_ms, report.batch1_batch = lone.p50_ms, batch
    served_ns = (after.succeeded_ns - before.succeeded_ns) / (after.succeeded - before.succeeded)
    report.batch1_server_ms = served_ns / 1e6
    objective_s = report.batch1_ms / 1000  # not judged here

    def probe(rate: float) -> Figures:
        settle(target.inferences)
        return target.window(SHIPPED, rate, 1, objective_s, setup.probe_window_s)[0]

    report.open_share, report.open_steps = open_share(probe, report.capacity)
    print(
        f"capacity {report.capacity:,.0f}/s, open loop kept up with {report.open_share:.0%} of "
        f"it, batch-1 p50 {report.batch1_ms:.2f} ms open-loop (mean batch "
        f"{report.batch1_batch:.2f}; the server's mean {report.batch1_server_ms:.2f} ms), "
        f"{report.batch1_closed_ms:.2f} ms closed-loop",
        flush=True,
    )


def settle(
    inferences: Callable[[], int],
    quiet_s: float = QUIET_S,
    limit_s: float = SETTLE_LIMIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until the server has run no inference for ``quiet_s`` (at most ``limit_s``), and
    return the seconds waited: a config that fell behind (delay 0 at 80 % load, p99 2-5 s)
    must not leave the next one a backlog, which at 80 % load would take five times as long
    to clear. Measured so far it never has: the requests of a run that fell behind are gone
    within half a second of perf_analyzer stopping (bench/NOTES.md, sixteenth round)."""
    start = clock()
    last, changed = inferences(), start
    while clock() - changed < quiet_s and clock() - start < limit_s:
        sleep(0.1)
        now = inferences()
        if now != last:
            last, changed = now, clock()
    return clock() - start


def _capacity_beside(target: Target, seconds: float, share: float) -> float:
    """The open-loop capacity again, right before a round of a load: this machine's speed
    drifts within minutes (other work on its cores), and a load is a share of the capacity of
    the moment. The closed-loop capacity is measured again and scaled by the open-loop share
    measured at the start (a search takes a minute; a closed-loop point four seconds)."""
    settle(target.inferences)
    return share * target.closed_loop(CAPACITY_CLIENTS, seconds).throughput


def config_order(round_: int, cell: int) -> tuple[str, ...]:
    """The configs in the order a round of a cell plays them: rotated by one place from each
    round to the next and from each cell to the next, so that over ``len(CONFIGS)`` rounds
    each config runs in each place of every cell once; and the rotation's direction flips
    from cell to cell (and within a cell after each ``len(CONFIGS)`` rounds), so that each
    config follows each of the others equally often. One direction alone had the objective
    always follow the half-objective delay and delay 0 always the objective: in the fortieth
    round's run the objective was 0.057 below its round's mean share after that delay and
    0.079 above it when first (``bench/NOTES.md``), and whatever one run leaves to the next
    would be read as a config's own."""
    n = len(CONFIGS)
    configs = CONFIGS if (cell + round_ // n) % 2 == 0 else CONFIGS[::-1]
    shift = (round_ + cell) % n
    return configs[shift:] + configs[:shift]


def _sweep(target: Target, report: Report, setup: Plan) -> None:
    """Every objective and load, with its rounds played back to back (the configs' order
    rotating) before the next load; the objective's two copies loaded with it first."""
    cells_before = 0
    for x in setup.objectives:
        objective_us = round(x * report.batch1_ms * 1000)
        target.reload(OBJECTIVE, report.server_objective_us(objective_us))
        target.reload(HALF, objective_us)
        for load in setup.loads:
            for round_ in range(setup.rounds):
                order = config_order(round_, cells_before)
                _play_round(target, report, setup, x, objective_us, load, round_, order)
            cells_before += 1


def _play_round(
    target: Target,
    report: Report,
    setup: Plan,
    x: int,
    objective_us: int,
    load: float,
    round_: int,
    order: tuple[str, ...],
) -> None:
    """One round of one objective and load: the capacity of the moment, then the same
    Poisson schedule played to each config's copy in ``order``, and last to the echo."""
    seed = 7919 * round_ + 104729 * x + int(1000 * load)
    capacity = _capacity_beside(target, setup.closed_s, report.open_share)
    for config in (*order, ECHO):
        waited = settle(target.inferences)
        figures, batch, planned, note = target.window(
            config, load * capacity, seed, objective_us / 1e6, setup.window_s
        )
        cell = Cell(x, objective_us, load, config, round_, figures, batch,
                    capacity, note, planned)  # fmt: skip
        report.cells.append(cell)
        print(
            f"  {x}x {load:.0%} of {capacity:,.0f}/s {config}: "
            f"{figures.share:.2%} within, goodput {figures.goodput:,.0f}/s, "
            f"p99 {figures.p99_ms:.2f} ms, batch {batch:.1f}"
            f"{'' if planned is None else f', planned {planned:.0%}'} {note}"
            f"(settled {waited:.1f} s before)",
            flush=True,
        )


def _async_note(line: str) -> str:
    """machine.describe's perf_analyzer line, for a bench whose load is asynchronous."""
    return line.replace(
        "sync mode",
        "sync mode for the capacity and one closed-loop client's latency, asynchronous for "
        "the open-loop loads (the lone requests' included)",
    )


def measure(model_dir: Path, setup: Plan) -> Report:
    model = model_dir.name
    shipped = load_pbtxt(model_dir / CONFIG_FILENAME)
    report = Report(
        header=[_async_note(line) for line in machine.describe()],
        command=" ".join(["python -m bench.objective", *sys.argv[1:]]),
        quick=setup.quick,
        model=model,
        window_s=setup.window_s,
        served=SIDE_BY_SIDE,
        judged=BY_DUE,
    )
    with tempfile.TemporaryDirectory(prefix="bench-objective-") as work:
        repository = scratch_repository(model_dir, Path(work))
        copies = [copy_name(model, config) for config in CONFIGS]
        with (
            servers.batchserve(repository, model, also=copies) as running,
            servers.floor(ECHO_MODULE, ECHO, "grpc") as echo,
        ):
            target = Target(running, model, shipped, Path(work), echo)
            _baseline(target, report, setup)
            _sweep(target, report, setup)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits_cnn", help="a model of model_repo/")
    parser.add_argument("--loads", default="0.5,0.8,0.95", help="shares of the capacity")
    parser.add_argument("--objectives", default="3,10", help="multiples of batch-1 latency")
    parser.add_argument("--window-s", type=float, default=Plan.window_s, help="per window")
    parser.add_argument("--rounds", type=int, default=Plan.rounds)
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "OBJECTIVE.md")
    parser.add_argument("--rerender", action="store_true", help="the report again from its JSON")
    args = parser.parse_args()
    figures = args.out.with_suffix(".json")
    if args.rerender:
        args.out.write_text(render(load_report(figures.read_text())))
        return 0
    setup = Plan(
        loads=tuple(float(v) for v in args.loads.split(",")),
        objectives=tuple(int(v) for v in args.objectives.split(",")),
        window_s=args.window_s,
        rounds=args.rounds,
        quick=args.quick,
    )
    if args.quick:
        setup = replace(setup, window_s=1.0, rounds=1, closed_s=2.0, probe_window_s=1.0)
    report = measure(ROOT / "model_repo" / args.model, setup)
    args.out.write_text(render(report))
    figures.write_text(dump(report))
    print(f"wrote {args.out} and {figures.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
