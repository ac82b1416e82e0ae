"""`make bench`: the in-process ceiling, the request floors and batchserve, in one run.

Writes bench/RESULTS.md (machine, versions, load, one table per section, the targets of the
performance issue as PASS/FAIL, notes). The full run takes 40-50 minutes on 2 cores;
--quick is a smoke run of a few minutes.

    python -m bench.run [--quick] [--model-repository DIR --models a,b] [--shape NAME:DIMS]
                        [--peers DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from bench import ceiling, machine, perf, repo, report, servers, targets
from bench.common import ROOT
from bench.inputs import ModelInputs, parse_shape, plan
from bench.procstat import busy_fraction, load1
from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    RAW_ASGI,
    Results,
    SectionLoad,
    ServerPoint,
    dump,
)
from bench.report import BUSY_LOAD

DEFAULT_MODELS = f"digits_cnn,char_lstm,{repo.RESNET}"
PROTOCOLS = ("http", "grpc")
HEAVY_MS = 5.0  # a model whose batch-1 call takes longer gets windows twice as long
# At the point a throughput target is judged, the model and its reference (echo floors or
# in-process ceiling) alternate this many times: one pair of windows moves with the minute.
PAIRED_ROUNDS = 3
# Before a section, wait (at most settle_s) for load1 to fall to BUSY_LOAD: the 1-minute
# average still carries the previous section, and would otherwise hide other work.
SETTLE_STEP_S = 5.0
FLOOR_SERVERS = (
    ("bench.floors.http_aiohttp", AIOHTTP, "http"),
    ("bench.floors.http_asgi", RAW_ASGI, "http"),
    ("bench.floors.grpc_aio", GRPC_AIO, "grpc"),
)


@dataclass(frozen=True)
class Plan:
    """How long and at which points a run measures."""

    quick: bool
    concurrency: tuple[int, ...]
    batches: tuple[int, ...]
    budget_s: float
    window_ms: int
    settle_s: float
    rounds: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        quick = bool(args.quick)
        concurrency: tuple[int, ...] = (1, 32) if quick else (1, 4, 16, 32)
        if args.concurrency:
            concurrency = tuple(int(c) for c in args.concurrency.split(","))
        rounds = args.rounds or (1 if quick else PAIRED_ROUNDS)
        if quick:
            return cls(quick, concurrency, (1, 8, 32, 64), 0.5, 1000, 0.0, rounds)
        return cls(quick, concurrency, (1, 2, 4, 8, 16, 32, 64), 2.0, 3000, 60.0, rounds)

    def settings(self, results: Results, model: str) -> perf.PaSettings:
        alone = results.ceiling(model, 1)
        heavy = alone is not None and alone.median_s * 1000 >= HEAVY_MS
        return perf.PaSettings(self.window_ms * (2 if heavy else 1))


@dataclass(frozen=True)
class Subject:
    """A model this run measures: where it lives, its variants and its request data."""

    name: str
    directory: Path
    unbatched: Path | None  # repository holding the batching-off variant (None: shipped off)
    inputs: ModelInputs

    @property
    def variants(self) -> list[tuple[str, Path]]:
        shipped = [("on" if self.unbatched else "off", self.directory.parent)]
        return shipped + ([("off", self.unbatched)] if self.unbatched else [])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--model-repository", type=Path, default=ROOT / "model_repo")
    add("--models", default=DEFAULT_MODELS,
        help=f"comma-separated; {repo.RESNET} is exported when not in the repository")  # fmt: skip
    add("--shape", action="append", default=[], metavar="NAME:DIMS",
        help="one sample's dims for an input with free axes (default 32 each)")  # fmt: skip
    add("--quick", action="store_true", help="short windows, c=1 and 32 only")
    add("--concurrency", help="override the concurrencies, e.g. 1,16")
    add("--rounds", type=int, default=0,
        help=f"paired rounds where targets are judged (default {PAIRED_ROUNDS})")  # fmt: skip
    add("--peers", type=Path, metavar="DIR", help="a directory holding venv/ with nvidia-pytriton")
    add("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    words = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "-m", "bench.run", *public_words(words)])
    results = Results(header=machine.describe(), command=command, quick=bool(args.quick))
    started, run_plan = time.monotonic(), Plan.from_args(args)
    try:
        with tempfile.TemporaryDirectory(prefix="batchserve-bench-") as tmp:
            runner = Runner(run_plan, Path(tmp), results)
            subjects, identity = prepare(args, runner.work, results)
            runner.run(subjects, identity, args.peers)
    except (Exception, KeyboardInterrupt) as exc:
        results.notes.append(f"The run stopped early ({type(exc).__name__}: {exc}).")
        raise
    finally:
        results.duration_s = time.monotonic() - started
        if results.ceilings:  # something was measured: keep it, even from a run cut short
            write(args.out, run_plan, results)
    return 0


PATH_OPTIONS = ("--peers", "--out", "--model-repository")


def public_words(words: Sequence[str]) -> list[str]:
    """The command line as RESULTS.md shows it: a path outside the repository names the
    machine it ran on, not the benchmark, so it is shown as its option's placeholder."""
    shown, previous = [], ""
    for word in words:
        option, equals, value = word.partition("=")
        if previous in PATH_OPTIONS:
            word = _public_path(word, previous)
        elif equals and option in PATH_OPTIONS:
            word = f"{option}={_public_path(value, option)}"
        shown.append(word)
        previous = word
    return shown


def _public_path(value: str, option: str) -> str:
    path = Path(value).resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return option.removeprefix("--").replace("-", "_").upper()


def write(out: Path, run_plan: Plan, results: Results) -> None:
    """RESULTS.md from whatever was measured, every figure beside it as JSON (for
    `python -m bench.rerender`), and each target's verdict on stdout."""
    results.notes = method_notes(run_plan, results) + results.notes
    verdicts = targets.evaluate(results)
    out.write_text(report.render(results, verdicts))
    out.with_suffix(".json").write_text(dump(results))
    for verdict in verdicts:
        print(f"{verdict.label:>12}  {verdict.target}: {verdict.measured}")
    print(f"wrote {out}")


def prepare(
    args: argparse.Namespace, work: Path, results: Results
) -> tuple[list[Subject], Subject]:
    """Locate or build every model, its batching-off variant and its request data."""
    shapes = dict(parse_shape(text) for text in args.shape)
    subjects = []
    for name in (n.strip() for n in args.models.split(",") if n.strip()):
        directory = locate(name, args.model_repository, work / "built")
        subjects.append(subject(directory, work / "unbatched", shapes, results))
    identity = subject(repo.write_identity(work / "floor"), None, shapes, results)
    return subjects, identity


def locate(name: str, source: Path, built: Path) -> Path:
    if name == IDENTITY:
        raise SystemExit(f"'{IDENTITY}' names the floor model of every run; measure another")
    if (source / name).is_dir():
        return source / name
    if name == repo.RESNET:
        print(f"exporting {name} with batchserve export", flush=True)
        return repo.export_resnet(built)
    raise SystemExit(f"model '{name}' is not in {source}")


def subject(
    directory: Path,
    unbatched_repo: Path | None,
    shapes: dict[str, tuple[int, ...]],
    results: Results,
) -> Subject:
    config = repo.completed_config(directory)
    inputs = plan(directory.name, config, shapes)
    results.notes += inputs.notes
    batches = config.HasField("dynamic_batching")
    results.shipped[directory.name] = "on" if batches else "off"
    unbatched = None
    if batches and unbatched_repo is not None:
        unbatched = repo.without_batching(directory, unbatched_repo).parent
    return Subject(directory.name, directory, unbatched, inputs)


def method_notes(run_plan: Plan, results: Results) -> list[str]:
    """How the figures were taken, with the windows this run actually used."""
    return [
        *measurement_notes(run_plan, results),
        "batchserve runs as it ships (`batchserve serve`, defaults, only the measured model "
        "loaded); batching off is the completed config without dynamic_batching.",
        "Server CPU µs/req: utime + stime of the server's process tree (/proc) over the whole "
        "perf_analyzer run, over the inferences the server counted in that run.",
        "perf_analyzer, the servers and the in-process ceiling share the machine's cores.",
        *_rounds_note(run_plan),
    ]


def measurement_notes(run_plan: Plan, results: Results) -> list[str]:
    """How the ceiling and each perf_analyzer point were taken, with this run's windows."""
    windows = {m: run_plan.settings(results, m).window_ms for m in results.shipped}
    heavy = [m for m, w in windows.items() if w > run_plan.window_ms]
    longer = f", {2 * run_plan.window_ms} ms for {', '.join(heavy)}" if heavy else ""
    return [
        f"Ceiling: one ONNX Runtime session per model (CPU EP, default options); each batch "
        f"size gets {ceiling.WARMUP_CALLS} warm-up calls, then calls for {run_plan.budget_s:g} s "
        f"(at least {ceiling.MIN_CALLS}) spread over {ceiling.ROUNDS} rounds that cycle through "
        "the sizes, so that every size samples the same minutes of this machine's drifting "
        "speed; samples/s = batch / median call time. Each batch repeats "
        "the sample the servers are sent.",
        f"perf_analyzer: `-b 1 --concurrency-range c:c --measurement-interval W "
        f"--stability-percentage 25 --max-trials 8`, binary tensors, the same sample in "
        f"--input-data; W = {run_plan.window_ms} ms{longer} (batch-1 call >= {HEAVY_MS:g} ms).",
    ]


def _rounds_note(run_plan: Plan) -> list[str]:
    if run_plan.rounds < 2:
        return []
    return [
        f"Paired rounds: where a model's throughput target is judged (c={targets.CEILING_C} "
        f"against the ceiling for a compute-bound model, c={targets.FLOOR_C} against the echo "
        f"floors otherwise), its point and the reference alternate {run_plan.rounds} times, a "
        "few seconds apart, and the target takes the median of the rounds' ratios; mean "
        "batch pools the rounds and p99 takes their median. Each round's row shows its own "
        f"ratios. The shipped configuration's c=1 point is also taken {run_plan.rounds} times, "
        "back to back, and its overhead target takes the median p50."
    ]


@dataclass(frozen=True)
class Runner:
    """Measures sections in order, appending every figure to ``results`` as it comes."""

    plan: Plan
    work: Path
    results: Results

    def run(self, subjects: list[Subject], identity: Subject, peers: Path | None) -> None:
        """Each model's ceiling right before its servers: this machine's speed drifts by
        10-20 % over minutes (steal time), and a ratio should compare like with like."""
        self.section(f"ceiling {identity.name}", partial(self.ceilings, [identity]))
        self.section("floors", partial(self.floors, identity))
        for s in subjects:
            self.section(f"ceiling {s.name}", partial(self.ceilings, [s]))
            self.section(f"batchserve {s.name}", partial(self.model, s, identity))
        if peers is not None:
            from bench.peers import launch

            self.section(
                "peers (PyTriton)", partial(launch.measure, peers, [*subjects, identity], self)
            )

    def section(self, name: str, body: Callable[[], None]) -> None:
        """One section, after the load of the last one has had time to decay (bounded)."""
        deadline = time.monotonic() + self.plan.settle_s
        while load1() > BUSY_LOAD and time.monotonic() < deadline:
            time.sleep(SETTLE_STEP_S)
        before, busy = load1(), busy_fraction(1.0)
        print(f"== {name} (load1 {before:.2f}, CPU busy {busy:.0%})", flush=True)
        body()
        self.results.sections.append(SectionLoad(name, before, load1(), busy))

    def ceilings(self, subjects: list[Subject]) -> None:
        batches, budget = self.plan.batches, self.plan.budget_s
        for s in subjects:
            for point in ceiling.measure(repo.onnx_file(s.directory), s.inputs, batches, budget):
                self.results.ceilings.append(point)
                print(report.ceiling_line(point), flush=True)

    def floors(self, identity: Subject) -> None:
        for module, label, protocol in FLOOR_SERVERS:
            serve = partial(servers.floor, module, label, protocol)
            self.guarded(serve, label, identity, "", (protocol,))
        self.variant(identity, "on", identity.directory.parent)

    def model(self, s: Subject, identity: Subject) -> None:
        for batching, repository in s.variants:
            self.variant(s, batching, repository, identity)

    def variant(
        self, s: Subject, batching: str, repository: Path, floors_of: Subject | None = None
    ) -> None:
        """``floors_of`` (the identity model): measure the echo floors right before the
        shipped variant's FLOOR_C points."""
        serve = partial(servers.batchserve, repository, s.name)
        shipped = batching == self.results.shipped.get(s.name)
        self.guarded(serve, BATCHSERVE, s, batching, PROTOCOLS, floors_of if shipped else None)

    def guarded(
        self,
        serve: Callable[[], AbstractContextManager[servers.Running]],
        label: str,
        s: Subject,
        batching: str,
        protocols: Sequence[str],
        floors_of: Subject | None = None,
    ) -> None:
        """Every point on one server; if the server fails, its points left are kept as failed."""
        try:
            with serve() as running:
                self.points(running, s, batching, protocols, floors_of)
        except RuntimeError as exc:
            for protocol in protocols:
                for c in self.plan.concurrency:
                    if not self.results.find(label, s.name, protocol, c, batching):
                        failed = ServerPoint(label, s.name, protocol, c, batching, None)
                        self.record(replace(failed, error=str(exc)))

    def points(
        self,
        running: servers.Running,
        s: Subject,
        batching: str,
        protocols: Sequence[str],
        floors_of: Subject | None = None,
    ) -> None:
        """Every protocol x concurrency point of one model on one running server. With
        ``floors_of`` (the identity model; the shipped variant), the echo floors right before
        the FLOOR_C point, and the point where the model's throughput target is judged in
        paired rounds with its reference. The shipped variant's c=1 point is taken in rounds
        too, back to back: its p50 is a target, and one window moves with the minute."""
        settings, extra = self.plan.settings(self.results, s.name), s.inputs.pa_args(self.work)
        judged = self.judged_at(s.name) if floors_of is not None else None
        shipped = running.label == BATCHSERVE and batching == self.results.shipped.get(s.name)
        repeated = {1, judged} if shipped else {judged}
        for protocol in protocols:
            for c in self.plan.concurrency:
                for round_ in range(self.plan.rounds if c in repeated else 1):
                    if floors_of is not None and c == targets.FLOOR_C:
                        self.floors_beside(s.name, floors_of, protocol, c, round_)
                    if c == judged == targets.CEILING_C:
                        self.ceiling_beside(s, protocol, round_)
                    args = (running, s.name, protocol, c, batching, settings, self.work, extra)
                    self.record(replace(servers.measure(*args), round=round_))

    def judged_at(self, model: str) -> int:
        """The concurrency of the model's throughput target: c=16 against the ceiling for a
        compute-bound model, c=32 against the echo floors otherwise."""
        compute_bound = targets.compute_bound(self.results, model)
        return targets.CEILING_C if compute_bound else targets.FLOOR_C

    def ceiling_beside(self, s: Subject, protocol: str, round_: int, served: str = "") -> None:
        """The in-process ceiling at its best batch size, right before the server's
        ``protocol`` point of ``round_`` (the server is up but idle); ``served``: the name
        that point is served under, where it is not the model's own (a variant's config)."""
        best = self.results.best_ceiling(s.name)
        if best is None:
            return
        model_file, budget = repo.onnx_file(s.directory), self.plan.budget_s
        for point in ceiling.measure(model_file, s.inputs, (best.batch,), budget, rounds=1):
            point = replace(point, beside=served or s.name, protocol=protocol, round=round_)
            self.results.ceilings.append(point)
            print(report.ceiling_line(point), flush=True)

    def floors_beside(
        self, model: str, identity: Subject, protocol: str, c: int, round_: int = 0
    ) -> None:
        """The echo floors of ``protocol`` at ``c``, each on a fresh server, taken right
        before ``model``'s point of ``round_``: this machine's speed drifts over minutes."""
        settings = self.plan.settings(self.results, identity.name)
        extra = identity.inputs.pa_args(self.work)
        for module, label, served in FLOOR_SERVERS:
            if served != protocol:
                continue
            try:
                with servers.floor(module, label, protocol) as echo:
                    args = (echo, identity.name, protocol, c, "", settings, self.work, extra)
                    point = servers.measure(*args)
            except RuntimeError as exc:
                point = ServerPoint(label, identity.name, protocol, c, "", None, error=str(exc))
            self.record(replace(point, beside=model, round=round_))

    def record(self, point: ServerPoint) -> None:
        self.results.points.append(point)
        print(report.progress_line(point), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
