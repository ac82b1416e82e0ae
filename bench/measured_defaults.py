"""Instances and threads measured at load, against the old default, a hand-tuned config and
the in-process ceiling, in one run; writes bench/MEASURED_DEFAULTS.md (and .json beside it).

    python -m bench.measured_defaults [--quick] [--rounds N] [--out FILE]
    python -m bench.measured_defaults --rerender [--out FILE]

Compute-bound CNNs not shipped with the project (``bench.models``: resnet18ish, vgg192ish,
mobilenetish) are exported with the real ``batchserve export``; each is served from one
batchserve under three configs (``measured_report``: the exporter's config, which the load
measures; the old default; one instance per core x one thread), and at gRPC c=16 each
config's point follows
the in-process ceiling at its best batch size, seconds apart, in paired rounds. Light models
(digits_cnn, char_lstm) are served with their counts and threads removed beside the same
config at ``count: 1``, the two taking turns at gRPC c=16 and HTTP c=32.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from batchserve.models.measured_defaults import THREAD_PARAMETERS, wants_tuning
from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt, to_pbtxt

from bench import machine, perf, repo, run, servers
from bench.common import ROOT, model_stats
from bench.measured_report import (
    CNN_VARIANTS,
    LIGHT_POINTS,
    MEASURED,
    OLD,
    TUNED,
    Choice,
    Run,
    dump,
    load,
    render,
    served,
    verdicts,
)
from bench.models import VGG_IMAGE_SIZE
from bench.records import Results
from bench.servers import Running
from bench.targets import CEILING_C

CNNS = (
    ("bench.models:resnet18ish", repo.RESNET, repo.FP32_IMAGE),
    ("bench.models:vgg192ish", "vgg192ish",
     ("--input", f"image:FP32:batch,3,{VGG_IMAGE_SIZE},{VGG_IMAGE_SIZE}")),
    ("bench.models:mobilenetish", "mobilenetish", repo.FP32_IMAGE),
)  # fmt: skip
LIGHT = ("digits_cnn", "char_lstm")
QUICK_WINDOW_MS = 2000
"""--quick's perf_analyzer window (twice that for a CNN): at c=16 a CNN's requests wait
hundreds of ms, and on a busy machine a 1 s window can end before any is answered."""
OUT = ROOT / "bench" / "MEASURED_DEFAULTS.md"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.measured_defaults", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="short windows, one round: a smoke run")
    add("--rounds", type=int, default=0,
        help=f"paired rounds (default {run.PAIRED_ROUNDS}, 1 with --quick)")  # fmt: skip
    add("--out", type=Path, default=OUT)
    add("--rerender", action="store_true", help="the report again from the JSON beside --out")
    parser.set_defaults(concurrency=None)  # run.Plan's: the points here are fixed
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rerender:
        write(args.out, load(args.out.with_suffix(".json").read_text()))
        return 0
    words = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "-m", "bench.measured_defaults", *run.public_words(words)])
    results = Results(header=machine.describe(), command=command, quick=bool(args.quick))
    measured, started = Run(results, cores=repo.usable_cores()), time.monotonic()
    taken = plan(args)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-measured-defaults-") as tmp:
            bench = Bench(run.Runner(taken, Path(tmp), results), measured)
            for factory, name, image in CNNS:
                bench.cnn(factory, name, image)
            for name in LIGHT:
                bench.light(name)
    except (Exception, KeyboardInterrupt) as exc:
        results.notes.append(f"The run stopped early ({type(exc).__name__}: {exc}).")
        raise
    finally:
        results.duration_s = time.monotonic() - started
        results.notes = method_notes(taken, results) + results.notes
        if results.points:  # something was measured: keep it, even from a run cut short
            write(args.out, measured)
    return 0


def method_notes(taken: run.Plan, results: Results) -> list[str]:
    """How the figures were taken: ``bench.run``'s ceiling and perf_analyzer, then here."""
    return [
        *run.measurement_notes(taken, results),
        f"Rounds: {taken.rounds}. A CNN's three configs are served by one batchserve, the "
        "measured one loaded first (its measuring runs with nothing else loaded); each "
        "config's point follows the ceiling at the section's best batch size, taken with the "
        "server up and idle. A light model's two configs share one server and take turns.",
        "Server CPU ms/req: utime + stime of the server's process tree (/proc) over the whole "
        "perf_analyzer run, over the inferences the server counted in that run; the server, "
        "perf_analyzer and the in-process ceiling share the machine's cores.",
    ]


def plan(args: argparse.Namespace) -> run.Plan:
    """``bench.run``'s plan (windows, ceiling batch sizes and budget, rounds, settling)."""
    taken = run.Plan.from_args(args)
    return replace(taken, window_ms=QUICK_WINDOW_MS) if taken.quick else taken


def write(out: Path, measured: Run) -> None:
    """The report and, beside it, every figure as JSON; each verdict on stdout."""
    found = verdicts(measured)
    out.write_text(render(measured, found))
    out.with_suffix(".json").write_text(dump(measured))
    for verdict in found:
        print(f"{verdict.label:>12}  {verdict.target}: {verdict.measured}")
    print(f"wrote {out}")


def configured_copy(source: Path, repository: Path, name: str, count: int = 0) -> Path:
    """``source`` copied into ``repository`` as ``name``, its config without thread parameters
    or instance groups, then with ``count`` instances where given (0: the load measures)."""
    target = repository / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(CONFIG_FILENAME, "configs"))
    config = load_pbtxt(source / CONFIG_FILENAME)
    config.name = name
    for parameter in THREAD_PARAMETERS:
        if parameter in config.parameters:
            del config.parameters[parameter]
    config.ClearField("instance_group")
    if count:
        config.instance_group.add(count=count)
    (target / CONFIG_FILENAME).write_text(to_pbtxt(config))
    return target


def measures_at_load(model_dir: Path) -> Path:
    """``model_dir``, once its config is checked to leave instances and threads to the load."""
    if not wants_tuning(load_pbtxt(model_dir / CONFIG_FILENAME)):
        raise SystemExit(f"{model_dir.name}'s config sets instances or threads: nothing to measure")
    return model_dir


@dataclass(frozen=True)
class Bench:
    """Each model's sections, on ``runner`` (its plan, load record and progress lines), with
    every figure and choice into ``figures``."""

    runner: run.Runner
    figures: Run

    @property
    def results(self) -> Results:
        return self.runner.results

    def cnn(self, factory: str, name: str, image: Sequence[str]) -> None:
        """Export, the ceiling section, then the three configs from one server in rounds."""
        repository = self.runner.work / name
        print(f"exporting {name} with batchserve export", flush=True)
        directory = measures_at_load(repo.export(repository, factory, name, image))
        configured_copy(directory, repository, served(name, OLD), count=1)
        repo.one_instance_per_core(configured_copy(directory, repository, served(name, TUNED)))
        subject = run.subject(directory, None, {}, self.results)
        self.figures.cnns.append(name)
        self.runner.section(f"ceiling {name}", partial(self.runner.ceilings, [subject]))
        self.section(f"batchserve {name}", partial(self.cnn_rounds, subject))

    def cnn_rounds(self, s: run.Subject) -> None:
        """Each round: every config's gRPC c=16 point right after the ceiling."""
        settings = self.runner.plan.settings(self.results, s.name)
        order = [served(s.name, variant) for variant in CNN_VARIANTS]
        with self.serve(s.directory.parent, s.name, order) as running:
            for round_ in range(self.runner.plan.rounds):
                for name in order if round_ % 2 == 0 else order[::-1]:
                    self.runner.ceiling_beside(s, "grpc", round_, served=name)
                    self.point(running, s, name, ("grpc", CEILING_C), round_, settings)

    def light(self, name: str) -> None:
        """The shipped model without its counts and threads, beside the same at count 1."""
        repository, source = self.runner.work / "light", ROOT / "model_repo" / name
        directory = measures_at_load(configured_copy(source, repository, name))
        configured_copy(source, repository, served(name, OLD), count=1)
        subject = run.subject(directory, None, {}, self.results)
        self.figures.light.append(name)
        self.section(f"batchserve {name}", partial(self.light_rounds, subject))

    def light_rounds(self, s: run.Subject) -> None:
        """At each point, the two configs take turns in each round, the old one first in
        odd rounds (the first is round 1)."""
        names = [served(s.name, OLD), served(s.name, MEASURED)]
        settings = self.runner.plan.settings(self.results, s.name)
        with self.serve(s.directory.parent, s.name, names) as running:
            for where in LIGHT_POINTS:
                for round_ in range(self.runner.plan.rounds):
                    for name in names if round_ % 2 == 0 else names[::-1]:
                        self.point(running, s, name, where, round_, settings)

    @contextmanager
    def serve(self, repository: Path, measured: str, names: Sequence[str]) -> Iterator[Running]:
        """One server holding every config, ``measured`` loaded (and measuring) first, while
        nothing else runs in it; what each load chose, from the statistics."""
        others = [name for name in names if name != measured]
        with servers.batchserve(repository, measured, also=others) as running:
            for name in names:
                choice = Choice.from_stats(model_stats(running.ports["http"], name))
                self.figures.choices[name] = choice
                if choice is not None:
                    print(f"  {name}: {choice.chosen} ({choice.reason}, {choice.seconds:.1f} s)")
            yield running

    def point(
        self,
        running: Running,
        s: run.Subject,
        name: str,
        where: tuple[str, int],
        round_: int,
        settings: perf.PaSettings,
    ) -> None:
        """One perf_analyzer point on the config served as ``name``, recorded as ``round_``."""
        extra, work = s.inputs.pa_args(self.runner.work), self.runner.work
        taken = servers.measure(running, name, *where, "on", settings, work, extra)
        self.runner.record(replace(taken, round=round_))

    def section(self, name: str, body: Callable[[], None]) -> None:
        """A server section; a server that fails to start or answer ends it with a note."""

        def guarded() -> None:
            try:
                body()
            except RuntimeError as exc:
                self.results.notes.append(f"{name} stopped: {exc}")
                print(f"  {name} stopped: {exc}", flush=True)

        self.runner.section(name, guarded)


if __name__ == "__main__":
    raise SystemExit(main())
