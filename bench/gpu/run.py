"""`make gpu-check` after its environment is set up: tests, exports, engines, served models.

    python -m bench.gpu [--cpu] [--out FILE] [--load auto|perf_analyzer|own] [--skip-tests]
                        [--cores-only] [--runtimes a,b] [--budget-s N]

1. discovery: the GPU (NVML), each runtime (used, or skipped with the reason), the load tool;
2. the plan: the grid, each phase's estimate and the cases dropped to fit the budget;
3. the GPU-marked tests (``bench.gpu.tests``);
4. every network x runtime x precision exported with ``batchserve export``;
5. each export in-process: accuracy against the FP32 eager module, then the engine's time
   per batch at batch 1, 2, 4, ... max;
6. the served cases, each on a fresh server, with the memory probe's figures and NVML's;
7. request handling across the machine's cores, where it has 8 or more (``cores.py``);
   ``--cores-only`` runs only that (with its one export) and then the tests, for a machine
   lent for a few minutes;
8. GPU_RESULTS.md (and .json beside it) with the targets judged, written after every phase
   and served case (marked as written while the run was under way, until the last), so that
   a run stopped from outside or failing part-way leaves what it measured. Exit status 1
   when a GPU test failed or errored, else 0: the targets are judged and written, not
   enforced.

``--cpu`` is the dry run: the same harness on the CPU runtimes with a tiny grid, written to
build/gpu-check/ unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.common import ROOT
from bench.gpu import cores, discover, engine, exports, load, nvml, plan, report, serve, targets
from bench.gpu import tests as gpu_tests
from bench.gpu.records import ExportResult, GpuResults, Key, Phase, dump
from bench.gpu.runtimes import BY_KEY, RuntimeSpec, for_mode
from bench.gpu.versions import cuda_line, header
from bench.inputs import plan as plan_inputs

CORES_PHASE = "request handling across cores"
GPU_OUT = ROOT / "bench" / "GPU_RESULTS.md"
CPU_OUT = ROOT / "build" / "gpu-check" / "GPU_RESULTS.md"
NO_GPU = (
    "gpu-check: no NVIDIA GPU: NVML is not available or reports no device (nvidia-ml-py and "
    "an NVIDIA driver are needed). Run it on a GPU machine, or `GPU_CHECK_CPU=1 make "
    "gpu-check` for the CPU dry run."
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--cpu", action="store_true", help="the CPU dry run (tiny grid, CPU runtimes)")
    add(
        "--out",
        type=Path,
        help=f"default {GPU_OUT.relative_to(ROOT)} (--cpu: {CPU_OUT.relative_to(ROOT)})",
    )
    add(
        "--load",
        choices=("auto", "perf_analyzer", "own"),
        default="auto",
        help="what drives the served points (auto: perf_analyzer where its binary runs)",
    )
    add("--skip-tests", action="store_true", help="leave out the GPU-marked tests")
    add(
        "--cores-only",
        action="store_true",
        help="only request handling across cores (its one export), then the tests: what a "
        "short loan of a GPU machine can fit",
    )
    add("--runtimes", help="comma-separated subset of the mode's runtimes")
    add(
        "--budget-s",
        type=float,
        help=f"the run's time limit (default {plan.GPU_BUDGET_S:.0f}; --cpu 600)",
    )
    add("--exports-parallel", type=int, default=3, help="exports run at once")
    return parser.parse_args(argv)


@dataclass
class Check:
    """One run: its grid, what it found, and a clock against the budget."""

    grid: plan.Grid
    results: GpuResults
    work: Path
    out: Path | None = None
    """Where the report is written after every phase and served case, so that a run stopped
    from outside (a machine lent for a fixed time) leaves what it had measured."""
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.grid.budget_s - (time.monotonic() - self.started)

    def save(self) -> None:
        if self.out is not None:
            self.results.duration_s = time.monotonic() - self.started
            write(self.out, self.results, quiet=True)

    @contextmanager
    def phase(self, name: str, planned_s: float) -> Iterator[None]:
        print(f"== {name} (planned {planned_s:.0f} s, {self.left_s():.0f} s left)", flush=True)
        began = time.monotonic()
        try:
            yield
        finally:
            self.results.phases.append(Phase(name, planned_s, time.monotonic() - began))
            self.save()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    grid = plan.Grid.for_mode(args.cpu)
    if args.budget_s:
        grid = replace(grid, budget_s=args.budget_s)
    gpu = nvml.gpu_info()
    if gpu is None and not args.cpu:
        raise SystemExit(NO_GPU)
    words = sys.argv[1:] if argv is None else list(argv)
    results = GpuResults("cpu" if args.cpu else "gpu", header(gpu), _command(words))
    out = args.out or (CPU_OUT if args.cpu else GPU_OUT)
    with tempfile.TemporaryDirectory(prefix="batchserve-gpu-check-") as tmp:
        check = Check(grid, results, Path(tmp), out)
        try:
            run(check, args)
        except (Exception, KeyboardInterrupt) as exc:
            results.notes.append(f"The run stopped early ({type(exc).__name__}: {exc}).")
            raise
        finally:
            results.duration_s = time.monotonic() - check.started
            results.finished = True
            write(out, results)
    return 1 if any(t.failed or t.errors or t.note for t in results.tests) else 0


def _command(words: Sequence[str]) -> str:
    shown = [w if not Path(w).is_absolute() else Path(w).name for w in words]
    return shlex.join(["python", "-m", "bench.gpu", *shown])


def run(check: Check, args: argparse.Namespace) -> None:
    """Discovery and the plan, then every phase in turn."""
    present, tool = _discover(check, args)
    budget = _budget(check, present, tool, args)
    print("== time budget", flush=True)
    print("\n".join(plan.budget_lines(budget, check.grid)), flush=True)
    check.results.dropped = [c.label for c in budget.dropped]
    _phases(check, args, present, budget, tool)


def _discover(check: Check, args: argparse.Namespace) -> tuple[list[RuntimeSpec], load.LoadTool]:
    results, specs = check.results, _specs(args, check.grid.cpu)
    print("== discovery", flush=True)
    results.runtimes = discover.discover(specs, check.grid.cpu)
    results.header.insert(-1, cuda_line())  # before the date
    for status in results.runtimes:
        found = f"used {status.version}" if status.present else f"skipped: {status.reason}"
        print(f"  {status.key}: {found}")
    tool, _ = load.choose(args.load)
    results.load_tool = tool.description
    print(f"  {tool.description}", flush=True)
    return [s for s in specs if s.key in results.present()], tool


def _phases(
    check: Check,
    args: argparse.Namespace,
    present: Sequence[RuntimeSpec],
    budget: plan.Budget,
    tool: load.LoadTool,
) -> None:
    results, planned = check.results, dict(budget.phases)
    if args.cores_only:  # the cores figures first: a loan may end before the tests do
        with check.phase("exports", planned["exports"]):
            results.exports = _exports(check, present, args.exports_parallel, cores_only=True)
        _across_cores(check, planned, tool)
        if not args.skip_tests:
            with check.phase("GPU tests", planned["GPU tests"]):
                limit = planned["GPU tests"] * plan.TESTS_LIMIT
                results.tests = gpu_tests.run(check.work, limit)
        return
    if not args.skip_tests:
        with check.phase("GPU tests", planned["GPU tests"]):
            results.tests = gpu_tests.run(check.work, planned["GPU tests"] * plan.TESTS_LIMIT)
    with check.phase("exports", planned["exports"]):
        results.exports = _exports(check, present, args.exports_parallel)
    with check.phase("in-process", planned["in-process"]):
        _engines(check)
    served_name = next(name for name in planned if name.startswith("served"))
    with check.phase("served", planned[served_name]):
        _serve_all(check, budget.kept, tool)
    _across_cores(check, planned, tool)


def _across_cores(check: Check, planned: dict[str, float], tool: load.LoadTool) -> None:
    """The request-handling-across-cores phase, where the machine and the plan allow it."""
    results = check.results
    split = cores.placement()
    taken = cores.counts_here(check.grid.cpu, split)
    if not taken:
        results.cores_note = (
            f"{cores.cores()} cores here; it needs {cores.MIN_CORES} or more, so that the "
            "workers and the load generator each have their own"
        )
        return
    if not planned[CORES_PHASE]:
        results.cores_note = (
            f"it did not fit the time budget beside the judged case ({check.grid.budget_s:.0f}"
            " s; --budget-s gives it the time)"
        )
        return
    with check.phase(CORES_PHASE, planned[CORES_PHASE]):
        model = cores.served_model(results.exports, check.grid.cpu, check.work)
        results.cores_model = model.description
        results.cores_cpus = split.describe() if split is not None else ""
        results.cores, results.cores_note = cores.measure(
            taken, tool, check.grid.window_s, check.work, model, split
        )


def _specs(args: argparse.Namespace, cpu: bool) -> list[RuntimeSpec]:
    specs = list(for_mode(cpu))
    if args.runtimes:
        wanted = [name.strip() for name in args.runtimes.split(",")]
        unknown = [name for name in wanted if name not in {s.key for s in specs}]
        if unknown:
            raise SystemExit(f"--runtimes: {unknown} not among {[s.key for s in specs]}")
        specs = [s for s in specs if s.key in wanted]
    return specs


def _budget(
    check: Check, present: Sequence[RuntimeSpec], tool: load.LoadTool, args: argparse.Namespace
) -> plan.Budget:
    grid = check.grid
    keys = export_keys(present, args.cores_only)
    kinds = {s.key: s.filename.rpartition(".")[2] for s in present}
    exporting = sum(plan.export_s(k, kinds[k.runtime], grid) for k in keys)
    point_s = tool.point_s(grid.window_s)
    fixed = [
        ("GPU tests", 0.0 if args.skip_tests else plan.TESTS_S[grid.cpu]),
        ("exports", exporting / max(1, args.exports_parallel)),
        ("in-process", 0.0 if args.cores_only else len(keys) * plan.engine_s(grid)),
    ]
    across = cores.planned_s(cores.counts_here(grid.cpu, cores.placement()), point_s)
    if args.cores_only:  # nothing served beside it: it always runs
        return plan.fit([*fixed, (CORES_PHASE, across)], [], grid, point_s)
    candidates = plan.cases([s.key for s in present], grid)
    # Request handling across cores comes after the judged case: where both do not fit, it
    # is dropped (planned at 0 s, and the report says why).
    before = sum(seconds for _, seconds in fixed) + plan.judged_s(candidates, grid, point_s)
    fixed.append((CORES_PHASE, across if before + across <= grid.budget_s else 0.0))
    return plan.fit(fixed, candidates, grid, point_s)


def export_keys(present: Sequence[RuntimeSpec], cores_only: bool) -> list[Key]:
    """The exports the run needs: every network x runtime x precision, or only the FP32
    digits CNN request handling across cores serves (``cores.served_model``)."""
    found = plan.keys([s.key for s in present])
    if cores_only:
        return [k for k in found if k.model == cores.MODEL and k.precision == "fp32"]
    return found


def _exports(
    check: Check, present: Sequence[RuntimeSpec], parallel: int, cores_only: bool = False
) -> list[ExportResult]:
    grid = check.grid
    root = check.work / "exports"
    jobs = [
        exports.job(key, BY_KEY[key.runtime], root, grid.max_batch, grid.image_size)
        for key in export_keys(present, cores_only)
    ]
    return exports.run_all(jobs, parallel)


def _engines(check: Check) -> None:
    results, grid = check.results, check.grid
    for done in results.exports:
        if not done.ok:
            continue
        spec = BY_KEY[done.key.runtime]
        print(f"  {done.key.label}", flush=True)
        try:
            found, points = engine.measure(
                done.key, Path(done.model_dir), spec, grid.batches, grid.ceiling_s, grid.image_size
            )
        except Exception as exc:  # a runtime's failure is a finding, not the end of the run
            results.notes.append(f"In-process {done.key.label} failed: {type(exc).__name__}: {exc}")
            continue
        results.accuracy += found
        results.engine += points
        for p in points:
            print(f"    b={p.batch}: {p.samples_per_s:,.1f}/s ({p.median_s * 1000:.3f} ms)")


def _serve_all(check: Check, kept: Sequence[plan.Case], tool: load.LoadTool) -> None:
    results, grid = check.results, check.grid
    exported = {e.key: Path(e.model_dir) for e in results.exports if e.ok}
    order = [s.key for s in for_mode(grid.cpu)]
    setup = serve.Setup(tool, grid.window_s, check.work)
    point_s = tool.point_s(grid.window_s)
    for case in sorted(kept, key=lambda c: (order.index(c.key.runtime), c.priority)):
        if case.key not in exported:
            results.notes.append(f"Not served ({case.label}): its export failed.")
            continue
        if case.priority and plan.case_s(case, grid, point_s) > check.left_s():
            results.dropped.append(f"{case.label} (the time left ran out)")
            continue
        _serve_one(check, case, exported[case.key], setup)
        check.save()


def _serve_one(check: Check, case: plan.Case, model_dir: Path, setup: serve.Setup) -> None:
    spec = BY_KEY[case.key.runtime]
    print(f"  {case.label}", flush=True)
    config = engine.config_of(model_dir)
    inputs = plan_inputs(config.name, config, {})
    served, memory, error = serve.run_case(case, model_dir, spec, inputs, setup)
    check.results.served += served
    if memory is not None:
        check.results.memory.append(memory)
    if error:
        check.results.notes.append(f"Served {case.label}: {error}")


def write(out: Path, results: GpuResults, quiet: bool = False) -> None:
    """The report and its JSON; ``quiet``: a report in progress, the verdicts not printed."""
    verdicts = targets.evaluate(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.render(results, verdicts))
    out.with_suffix(".json").write_text(dump(results))
    if quiet:
        return
    for verdict in verdicts:
        print(f"{verdict.label:>12}  {verdict.target}: {verdict.measured}")
    print(f"wrote {out}")
