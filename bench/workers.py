"""Request handling across processes (``--workers``): CPU per request in the model-owning
process and in each worker, throughput with N workers, and what these project for larger
nodes.

    python -m bench.workers [--workers 1,2] [--window-ms 4000] [--grpc-shared-connections]
                            [--out bench/WORKERS.md]

Every point is perf_analyzer (batch 1 per request, binary tensors) against a real server on
loopback; CPU is read from /proc before and after each point and divided by the requests
the server's own statistics counted in between. perf_analyzer shares the machine. Its gRPC
clients each open a connection of their own, as a node's independent clients do: the kernel
spreads connections, not requests, over the workers, and perf_analyzer's default of one
connection per six clients measures that spread more than the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchserve.runtime.cpus import auto_workers

from bench import machine, procstat
from bench.common import ROOT, start_server, stop_server
from bench.perf import PaSettings, run
from bench.records import PaRow
from bench.repo import write_identity

MODELS = ("digits_cnn", "identity")
PROTOCOLS = ("http", "grpc")
CONCURRENCY = (32, 64)
PROJECTED_CORES = (8, 16)


@dataclass(frozen=True)
class Point:
    workers: int
    model: str
    protocol: str
    concurrency: int
    throughput: float
    engine_us: float
    """CPU per request in the model-owning process (the whole process when workers = 1)."""
    worker_us: tuple[float, ...]
    """CPU per request in each worker: its CPU over every request the server answered."""
    stable: bool
    machine_busy: float = 0.0
    """Share of the machine's CPU time busy over the point (0..1): server, load generator
    and anything else; near 1 the host, not the server, set the throughput."""


def _worker_pids(engine: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent, _ = procstat.parse_stat((entry / "stat").read_text())
                command = (entry / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if parent == engine and b"worker_process" in command:
                found.append(int(entry.name))
    return sorted(found)


def _ticks(pid: int) -> int:
    return procstat.parse_stat(Path(f"/proc/{pid}/stat").read_text())[1]


def _machine_ticks() -> tuple[int, int]:
    return procstat.cpu_ticks(Path("/proc/stat").read_text())


def _answered(port: int, model: str) -> int:
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"])


Driver = Callable[..., tuple[PaRow | None, str]]
"""What takes one point: ``bench.perf.run``'s signature (model, protocol, url, concurrency,
settings, work, extra)."""


def grid() -> list[tuple[str, str, int]]:
    """This bench's points: each model over each protocol at each concurrency."""
    return [(m, p, c) for m in MODELS for p in PROTOCOLS for c in CONCURRENCY]


def measure(
    workers: int,
    repo: Path,
    settings: PaSettings,
    work: Path,
    points: Sequence[tuple[str, str, int]] | None = None,
    driver: Driver = run,
    extra: Mapping[str, Sequence[str]] | None = None,
) -> list[Point]:
    """Each (model, protocol, concurrency) of ``points`` (default ``grid()``) against one
    server with ``workers`` request-handling processes; ``driver`` takes each point, with
    ``extra[model]`` as its further arguments."""
    process, ports = start_server(repo, ("--workers", str(workers), "--log-format", "json"))
    found = []
    try:
        time.sleep(1.0)
        pids = [process.pid, *_worker_pids(process.pid)]
        assert len(pids) == (1 if workers == 1 else workers + 1), pids
        hz = os.sysconf("SC_CLK_TCK")
        for model, protocol, concurrency in grid() if points is None else points:
            port = ports["http_port" if protocol == "http" else "grpc_port"]
            before = {pid: _ticks(pid) for pid in pids}
            answered = _answered(ports["http_port"], model)
            machine_before = _machine_ticks()
            row, error = driver(model, protocol, f"127.0.0.1:{port}", concurrency, settings,
                                work, (extra or {}).get(model, ()))  # fmt: skip
            if row is None:
                raise RuntimeError(f"{model} over {protocol} at c={concurrency}: {error}")
            (busy_now, total_now), (busy_then, total_then) = _machine_ticks(), machine_before
            count = _answered(ports["http_port"], model) - answered
            us = [(_ticks(p) - before[p]) / hz * 1e6 / count for p in pids]
            point = Point(workers, model, protocol, concurrency, row.throughput,
                          us[0], tuple(us[1:]), row.stable,
                          (busy_now - busy_then) / max(1, total_now - total_then))  # fmt: skip
            print(point, flush=True)
            found.append(point)
    finally:
        stop_server(process)
    return found


def projection(point: Point, cores: int) -> float:
    """Requests a second on ``cores`` with the ``auto`` workers, from a multi-worker point's
    CPU costs: the least of the model-owning process's bound (one core), the workers' bound
    (one core each) and the node's (every core busy)."""
    workers = auto_workers(cores)
    worker_us = sum(point.worker_us)  # what one request costs the workers, all together
    return min(
        1e6 / point.engine_us,
        workers * 1e6 / worker_us,
        cores * 1e6 / (point.engine_us + worker_us),
    )


def render(points: list[Point], settings: PaSettings) -> str:
    lines = ["# Request handling across processes (`--workers`)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    lines += [
        f"- perf_analyzer: {settings.window_ms} ms windows, stability {settings.stability} %; "
        "CPU from /proc over each point, divided by the requests the server counted; machine "
        "busy: the share of all the cores' time that was busy over the point (the server, "
        "perf_analyzer and the rest)",
        "- gRPC connections: "
        + (
            "one per client (`TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1`)"
            if settings.grpc_connection_per_client
            else "perf_analyzer's default, one per six clients"
        ),
        "",
        "| workers | model | protocol | concurrency | throughput (infer/s) | model-owning "
        "process µs CPU/request | each worker µs CPU/request | machine busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        each = ", ".join(f"{us:.0f}" for us in p.worker_us) or "(one process)"
        flag = "" if p.stable else " (unstable)"
        lines.append(f"| {p.workers} | {p.model} | {p.protocol} | {p.concurrency} | "
                     f"{p.throughput:,.0f}{flag} | {p.engine_us:.1f} | {each} | "
                     f"{p.machine_busy:.0%} |")  # fmt: skip
    lines += ["", "## Ratio N workers / one process (same model, protocol, concurrency)", "",
              "| workers | model | protocol | concurrency | throughput ratio |",
              "|---|---|---|---|---|"]  # fmt: skip
    base = {(p.model, p.protocol, p.concurrency): p for p in points if p.workers == 1}
    for p in points:
        one = base.get((p.model, p.protocol, p.concurrency))
        if p.workers > 1 and one is not None:
            lines.append(f"| {p.workers} | {p.model} | {p.protocol} | {p.concurrency} | "
                         f"{p.throughput / one.throughput:.2f} |")  # fmt: skip
    lines += ["", "## Projection (not measured): node throughput from the CPU costs above", "",
              "Each figure is the least of three bounds, from the measured CPU per request: the "
              "model-owning process on one core, the `auto` workers, and every core of the node "
              "busy. It assumes the costs stay what they were here; a GPU node's faster cores "
              "and the model's own compute change them. The first bound is pessimistic: the "
              "model-owning process's cost per request falls as its load rises (workers hold "
              "their requests while it is busy, so they travel in larger groups; "
              "`MODEL_OWNER.md` measures it loaded).", "",
              "| from | model | protocol | concurrency | "
              + " | ".join(f"{c} cores (projected)" for c in PROJECTED_CORES) + " |",
              "|---|---|---|---|" + "---|" * len(PROJECTED_CORES)]  # fmt: skip
    for p in points:
        if not p.worker_us:
            continue
        projected = " | ".join(f"{projection(p, c):,.0f}" for c in PROJECTED_CORES)
        lines.append(f"| {p.workers} worker(s) | {p.model} | {p.protocol} | {p.concurrency} | "
                     f"{projected} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--window-ms", type=int, default=4000)
    parser.add_argument(
        "--grpc-shared-connections",
        action="store_true",
        help="perf_analyzer's default: six gRPC clients to a connection",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "WORKERS.md")
    args = parser.parse_args()
    settings = PaSettings(
        args.window_ms,
        stability=25,
        max_trials=6,
        grpc_connection_per_client=not args.grpc_shared_connections,
    )
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        shutil.copytree(ROOT / "model_repo" / "digits_cnn", repo / "digits_cnn")
        write_identity(repo)
        points = []
        for workers in (int(n) for n in args.workers.split(",")):
            points += measure(workers, repo, settings, Path(tmp))
    args.out.write_text(render(points, settings))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
