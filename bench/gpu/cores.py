"""Request handling across the machine's cores: the same model served with N = 1, 2, 4 and 8
request-handling processes (``--workers N``), as far as the cores allow, each point's
throughput beside N times the one-process throughput.

Only a machine with at least ``MIN_CORES`` cores measures it (the dry run takes N = 1 and 2
on tiny windows, to prove the phase): on fewer, the load generator and the workers would
share cores and the figures would say nothing about scaling. The server and the load
generator run on CPUs of their own, split by physical core (``bench.cpu_split``), so that
the figures are the server's, as on a node whose clients are elsewhere, and each point says
how busy each side's CPUs were: near 100 % on the load generator's, it set the throughput.
The model is the digits CNN, a light one (request handling, not compute, is what is
measured), as the check exported it for the first of the mode's runtimes that has it at
FP32 (``served_model``): on a GPU host it then runs on the GPU, as on the node the workers
are there to feed, and its compute leaves the cores the request handling shares. There it
runs as captured CUDA graphs: launched op by op, the pt2 program took 0.61-0.67 ms a batch
in-process whatever its size, 1 to 64 (the H200 run of 2026-12-04), the time of launching
it from Python, paid on the model-owning process's cores; that is the runtime's cost, not
request handling's, and a GPU deployment of a light model replays it away (the load's
measured defaults try graphs on a GPU for that reason). Where no such export succeeded it
is the model as shipped, on the CPU. The clients are ``CLIENTS_PER_WORKER`` per process so
that each one is kept busy, and the CPU of the model-owning process and of the workers is
read from ``/proc`` (``bench.workers``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench import cpu_split
from bench import workers as workers_bench
from bench.common import ROOT
from bench.cpu_split import CpuSplit
from bench.gpu import engine, variants
from bench.gpu.load import LoadTool
from bench.gpu.records import DIGITS, CoresPoint, ExportResult, Key, Variant
from bench.gpu.runtimes import for_mode
from bench.inputs import plan as plan_inputs
from bench.targets import Verdict

MODEL = DIGITS
COUNTS = (1, 2, 4, 8)
MIN_CORES = 8
CLIENTS_PER_WORKER = 32
PROTOCOLS = ("http", "grpc")
SCALING = 0.7
"""The target: N processes serve at least this share of N times one process's throughput."""
START_S = 6.0  # a server with its workers, and the model loaded


def cores() -> int:
    """The cores this process may run on (cgroup and affinity limits included)."""
    return len(os.sched_getaffinity(0))


def counts(available: int, dry_run: bool, server_cpus: int | None = None) -> tuple[int, ...]:
    """The process counts to measure: none below ``MIN_CORES`` (but the dry run's 1 and 2);
    with ``server_cpus`` of the server's own, as many workers as leave one of them to the
    model-owning process, else at most half the cores, the rest left to the load generator."""
    if dry_run:
        return (1, 2)
    if available < MIN_CORES:
        return ()
    most = available // 2 if server_cpus is None else server_cpus - 1
    return tuple(n for n in COUNTS if n <= most)


def placement() -> CpuSplit | None:
    """The server's CPUs and the load generator's (None: fewer than two physical cores)."""
    return cpu_split.machine_split()


def counts_here(dry_run: bool, cpus: CpuSplit | None) -> tuple[int, ...]:
    """``counts`` for this machine, the server on ``cpus.server`` where given."""
    return counts(cores(), dry_run, None if cpus is None else len(cpus.server))


def planned_s(taken: Sequence[int], point_s: float) -> float:
    return sum(START_S + len(PROTOCOLS) * point_s for _ in taken)


@dataclass(frozen=True)
class ServedModel:
    """What the phase serves: a repository, the model's name in it, and what the report
    calls it."""

    repository: Path
    name: str
    description: str


def served_model(exports: Sequence[ExportResult], cpu: bool, work: Path) -> ServedModel:
    """The digits CNN as exported for the first of the mode's runtimes (GPU ones on a GPU
    host, CPU ones in the dry run) whose FP32 export succeeded, batched, one instance on the
    runtime's device, as CUDA graphs on a GPU; else the model as shipped (ONNX Runtime on
    the CPU)."""
    done = {e.key: Path(e.model_dir) for e in exports if e.ok}
    for spec in for_mode(cpu):
        model_dir = done.get(Key(MODEL, spec.key, "fp32"))
        if model_dir is not None:
            on_gpu = spec.device == "gpu"
            variant = Variant(graphs=on_gpu)
            repository = variants.build(model_dir, work / "cores", variant, spec.device)
            graphs = ", CUDA graphs" if on_gpu else ""
            return ServedModel(repository, spec.served_name(MODEL),
                               f"{MODEL} as exported for {spec.label}, FP32{graphs}, on the "
                               f"{spec.device.upper()}")  # fmt: skip
    return shipped(work)


def shipped(work: Path) -> ServedModel:
    """The digits CNN as ``model_repo`` ships it: ONNX Runtime on the CPU."""
    repository = work / "cores-repo"
    shutil.copytree(ROOT / "model_repo" / MODEL, repository / MODEL, dirs_exist_ok=True)
    return ServedModel(repository, MODEL, f"{MODEL} as shipped (ONNX Runtime, on the CPU)")


def measure(
    taken: Sequence[int],
    tool: LoadTool,
    window_s: float,
    work: Path,
    model: ServedModel | None = None,
    cpus: CpuSplit | None = None,
) -> tuple[list[CoresPoint], str]:
    """Every count's points on ``model`` (default: as shipped), the server and the load
    generator on ``cpus`` (None: both on any), and why the phase stopped early ("" when it
    did not): a server or a point that fails is a finding, not the end of the check."""
    model = model or shipped(work)
    repo, name = model.repository, model.name
    config = engine.config_of(repo / name)
    onnx = config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"
    if onnx and importlib.util.find_spec("onnxruntime") is None:
        return [], f"{name} is an ONNX model and this Python has no onnxruntime"
    inputs = plan_inputs(name, config, {})
    extra = {name: tool.extra(inputs, work)}
    # A connection per client, as a node's many clients open: the kernel spreads connections,
    # not requests, over the workers (SO_REUSEPORT), so a few would measure their spread.
    load_cpus = cpus.load if cpus is not None else ()
    settings = replace(tool.settings(window_s), grpc_connection_per_client=True, cpus=load_cpus)
    if tool.own:
        # The load may have the CPUs the workers do not: its own, or half of them.
        extra[name] += ["--procs", str(max(1, len(load_cpus) or cores() // 2))]
    server_cpus = cpus.server if cpus is not None else ()
    found: list[CoresPoint] = []
    for n in taken:
        points = [(name, protocol, CLIENTS_PER_WORKER * n) for protocol in PROTOCOLS]
        try:
            measured = workers_bench.measure(
                n, repo, settings, work, points, tool.driver(), extra, server_cpus
            )
        except (Exception, SystemExit) as exc:  # SystemExit: a server that did not start
            return found, f"{n} worker(s): {type(exc).__name__}: {exc}"
        for p in measured:
            found.append(CoresPoint(p.workers, p.protocol, p.concurrency, p.throughput,
                                    p.engine_us, sum(p.worker_us), p.stable,
                                    p.machine_busy, p.load_us, p.per_frame,
                                    p.server_busy, p.load_busy, p.loop_busy,
                                    p.busiest_worker, p.p50_ms, p.mean_batch))  # fmt: skip
    return found, ""


SATURATED = 0.9
"""A thread or CPU busy this share of the time is taken to be what set the throughput."""


def bound(point: CoresPoint) -> str:
    """What set a point's throughput, from how busy each part was: the model-owning process's
    event loop (one thread for every worker's frames and the batchers), the busiest worker,
    the server's or the load generator's CPUs; where none was saturated, the closed loop's
    latency (its clients over the median latency), which the mean batch then explains."""
    if point.loop_busy is not None and point.loop_busy >= SATURATED:
        return "the model-owning process's event loop"
    if point.busiest_worker is not None and point.busiest_worker >= SATURATED:
        return "the busiest worker"
    if point.workers == 1 and point.owner_us * point.throughput / 1e6 >= SATURATED:
        return "the one process"
    if point.server_busy is not None and point.server_busy >= SATURATED:
        return "the server's CPUs"
    if point.load_busy is not None and point.load_busy >= SATURATED:
        return "the load generator's CPUs"
    if point.machine_busy >= SATURATED:
        return "the machine's CPUs"
    return "nothing saturated: latency"


def scaling(points: Sequence[CoresPoint], protocol: str) -> list[tuple[CoresPoint, float]]:
    """Each point over ``protocol`` with its throughput / (N x the one-process throughput)."""
    mine = sorted((p for p in points if p.protocol == protocol), key=lambda p: p.workers)
    one = next((p for p in mine if p.workers == 1), None)
    if one is None or not one.throughput:
        return []
    return [(p, p.throughput / (p.workers * one.throughput)) for p in mine]


def verdicts(points: Sequence[CoresPoint]) -> list[Verdict]:
    """Per protocol: every count measured keeps ``SCALING`` of N x one process."""
    found = []
    for protocol in PROTOCOLS:
        rows = [(p, share) for p, share in scaling(points, protocol) if p.workers > 1]
        most = max((p.workers for p, _ in rows), default=max(COUNTS))
        target = f"{MODEL} {protocol}: N workers >= {SCALING} x N x one process, N = 2..{most}"
        if not rows:
            found.append(Verdict(target, "not measured", None))
            continue
        worst = min(share for _, share in rows)
        measured = ", ".join(f"N={p.workers}: {share:.2f}" for p, share in rows)
        found.append(Verdict(target, measured, worst >= SCALING, worst))
    return found
