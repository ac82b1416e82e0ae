"""Request handling across processes (``--workers``): CPU per request in the model-owning
process and in each worker, throughput with N workers, and what these project for larger
nodes.

    python -m bench.workers [--workers 1,2] [--rounds 3] [--window-ms 4000]
                            [--grpc-shared-connections] [--out bench/WORKERS.md]

Every point is perf_analyzer (batch 1 per request, binary tensors) against a real server on
loopback; CPU is read from /proc before and after each point and divided by the requests
the server's own statistics counted in between. perf_analyzer shares the machine. Its gRPC
clients each open a connection of their own, as a node's independent clients do: the kernel
spreads connections, not requests, over the workers, and perf_analyzer's default of one
connection per six clients measures that spread more than the workers. A server of each
worker count runs throughout, and each round takes every point on each back to back, the
order reversing from round to round: on a host whose speed drifts by more than the workers
change, N workers against one process is judged round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from batchserve.runtime.cpus import auto_workers
from batchserve.runtime.fork_server import WORKER_NAME

from bench import cpu_split, machine, procstat
from bench.common import ROOT, metric_total, start_server, stop_server
from bench.perf import PaSettings, run
from bench.records import PaRow

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
    round_index: int = 1
    """Which round of a paired run (``paired``) took it."""
    load_us: float = 0.0
    """CPU per request in the load generator (perf_analyzer and its children)."""
    per_frame: float = 0.0
    """Requests per frame from the workers to the model-owning process (the mean group,
    from the metrics port; 0 with one process): that process pays most of its CPU per frame,
    so its cost per request falls as this rises."""
    server_busy: float | None = None
    """Share of the server's CPUs' time busy over the point, where the server and the load
    generator had CPUs of their own (``bench.cpu_split``; else None)."""
    load_busy: float | None = None
    """The same share of the load generator's CPUs."""
    loop_busy: float | None = None
    """The model-owning process's event-loop thread: its CPU over the point's wall time, in
    cores (with workers; None in one process). Near 1 that one thread, which reads every
    worker's frames and runs the batchers, bounds the node's request handling."""
    busiest_worker: float | None = None
    """The busiest worker's CPU over the point's wall time, in cores (None in one process):
    the kernel spreads connections, not requests, over the workers, so one may saturate
    before the others."""
    p50_ms: float = 0.0
    """perf_analyzer's median latency: with every side's cores to spare, a closed loop's
    throughput is its clients over this."""
    mean_batch: float = 0.0
    """Inferences over executions the server counted over the point."""


def _worker_pids(engine: int) -> list[int]:
    """The workers among the model-owning process's descendants (its children, forked or
    started afresh, beside the fork server), by the name each gives itself."""
    return sorted(
        pid
        for pid in procstat.descendants(engine)
        if procstat.command_name(pid).startswith(WORKER_NAME.partition("{")[0])
    )


def _ticks(pid: int) -> int:
    return procstat.parse_stat(Path(f"/proc/{pid}/stat").read_text())[1]


def _loop_ticks(pid: int) -> int:
    """CPU ticks of ``pid``'s main thread alone: the event loop's."""
    return procstat.parse_stat(Path(f"/proc/{pid}/task/{pid}/stat").read_text())[1]


def _machine_ticks() -> tuple[int, int]:
    return procstat.cpu_ticks(Path("/proc/stat").read_text())


def _sides_ticks(sides: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(busy, total) ticks of each group of CPUs in ``sides`` (none: nothing to read)."""
    return cpu_split.busy_shares(Path("/proc/stat").read_text(), sides) if sides else []


def _shares(
    before: Sequence[tuple[int, int]], after: Sequence[tuple[int, int]]
) -> tuple[float | None, float | None]:
    """The server's and the load generator's busy shares between two readings (None, None
    where their CPUs were not split)."""
    if len(before) != 2:
        return None, None
    (s0, s_total0), (l0, l_total0) = before
    (s1, s_total1), (l1, l_total1) = after
    return (s1 - s0) / max(1, s_total1 - s_total0), (l1 - l0) / max(1, l_total1 - l_total0)


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended: the load generator's runs
    (the server, still running, is not among them)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _handed_over(metrics_port: int) -> tuple[float, float]:
    """Requests the workers handed over so far, and the frames they travelled in."""
    return (metric_total(metrics_port, "batchserve_worker_requests_total"),
            metric_total(metrics_port, "batchserve_worker_handoffs_total"))  # fmt: skip


def _answered(port: int, model: str) -> tuple[int, int, int]:
    """Requests answered so far, and the inferences and executions they made."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    answered = int(stats["inference_stats"]["success"]["count"])
    return answered, int(stats["inference_count"]), int(stats["execution_count"])


Driver = Callable[..., tuple[PaRow | None, str]]
"""What takes one point: ``bench.perf.run``'s signature (model, protocol, url, concurrency,
settings, work, extra)."""


def grid() -> list[tuple[str, str, int]]:
    """This bench's points: each model over each protocol at each concurrency."""
    return [(m, p, c) for m in MODELS for p in PROTOCOLS for c in CONCURRENCY]


@dataclass(frozen=True)
class Serving:
    """A running server: its ports and the pids of the model-owning process and workers."""

    workers: int
    ports: Mapping[str, int]
    pids: tuple[int, ...]
    cpus: tuple[int, ...] = ()
    """The CPUs it runs on (empty: any)."""


@contextmanager
def serving(workers: int, repo: Path, cpus: Sequence[int] = ()) -> Iterator[Serving]:
    """A server with ``workers`` request-handling processes, on ``cpus`` (empty: any),
    stopped on leaving."""
    flags = ("--workers", str(workers), "--log-format", "json")
    process, ports = start_server(repo, flags, cpus)
    try:
        time.sleep(1.0)
        pids = (process.pid, *_worker_pids(process.pid))
        assert len(pids) == (1 if workers == 1 else workers + 1), pids
        yield Serving(workers, ports, pids, tuple(cpus))
    finally:
        stop_server(process)


def take(
    server: Serving,
    point: tuple[str, str, int],
    settings: PaSettings,
    work: Path,
    driver: Driver = run,
    extra: Sequence[str] = (),
    round_index: int = 1,
) -> Point:
    """One (model, protocol, concurrency) point against a running server; CPU from /proc
    over it, divided by the requests the server counted."""
    model, protocol, concurrency = point
    ports, pids, hz = server.ports, server.pids, os.sysconf("SC_CLK_TCK")
    port = ports["http_port" if protocol == "http" else "grpc_port"]
    # before the CPU is read: a scrape asks every worker for its counts
    handed = _handed_over(ports["metrics_port"])
    before = {pid: _ticks(pid) for pid in pids}
    loop_before = _loop_ticks(pids[0])
    answered, inferences, executions = _answered(ports["http_port"], model)
    sides = (server.cpus, settings.cpus) if server.cpus and settings.cpus else ()
    machine_before, load_before = _machine_ticks(), _children_cpu_s()
    sides_before = _sides_ticks(sides)
    started = time.monotonic()
    row, error = driver(model, protocol, f"127.0.0.1:{port}", concurrency, settings, work, extra)
    if row is None:
        raise RuntimeError(f"{model} over {protocol} at c={concurrency}: {error}")
    wall_s = time.monotonic() - started
    (busy_now, total_now), (busy_then, total_then) = _machine_ticks(), machine_before
    server_busy, load_busy = _shares(sides_before, _sides_ticks(sides))
    loop_s = (_loop_ticks(pids[0]) - loop_before) / hz
    load_s = _children_cpu_s() - load_before
    ticks = [_ticks(p) - before[p] for p in pids]
    answered_now, inferences_now, executions_now = _answered(ports["http_port"], model)
    count = answered_now - answered
    us = [t / hz * 1e6 / count for t in ticks]
    requests, frames = _handed_over(ports["metrics_port"])  # none in one process
    per_frame = (requests - handed[0]) / max(1.0, frames - handed[1])
    several = len(pids) > 1
    taken = Point(server.workers, model, protocol, concurrency, row.throughput, us[0],
                  tuple(us[1:]), row.stable,
                  (busy_now - busy_then) / max(1, total_now - total_then), round_index,
                  load_s * 1e6 / count, per_frame, server_busy, load_busy,
                  loop_s / wall_s if several else None,
                  max(ticks[1:]) / hz / wall_s if several else None, row.p50_us / 1000,
                  (inferences_now - inferences) / max(1, executions_now - executions))  # fmt: skip
    print(taken, flush=True)
    return taken


def measure(
    workers: int,
    repo: Path,
    settings: PaSettings,
    work: Path,
    points: Sequence[tuple[str, str, int]] | None = None,
    driver: Driver = run,
    extra: Mapping[str, Sequence[str]] | None = None,
    cpus: Sequence[int] = (),
) -> list[Point]:
    """Each (model, protocol, concurrency) of ``points`` (default ``grid()``) against one
    server with ``workers`` request-handling processes, on ``cpus`` (empty: any); ``driver``
    takes each point, with ``extra[model]`` as its further arguments."""
    with serving(workers, repo, cpus) as server:
        return [take(server, point, settings, work, driver, (extra or {}).get(point[0], ()))
                for point in (grid() if points is None else points)]  # fmt: skip


def paired(
    counts: Sequence[int],
    repo: Path,
    settings: PaSettings,
    work: Path,
    rounds: int,
    points: Sequence[tuple[str, str, int]] | None = None,
    driver: Driver = run,
) -> list[Point]:
    """``rounds`` rounds of every point on a server of each count, all serving at once: within
    a round each point is taken on every count back to back, the order reversing from round
    to round, so that a drift of the host's speed between them favours none."""
    with ExitStack() as stack:
        servers = [stack.enter_context(serving(n, repo)) for n in counts]
        taken = []
        for round_index in range(1, rounds + 1):
            for point in grid() if points is None else points:
                for server in servers if round_index % 2 else servers[::-1]:
                    taken.append(take(server, point, settings, work, driver, (), round_index))
    return taken


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


TARGET_RATIO = 0.9
"""Issue 23's bar for two workers against one process on two cores."""


def ratios(points: Sequence[Point]) -> dict[tuple[int, str, str, int], list[float]]:
    """Each multi-worker point's throughput over the one-process point of the same model,
    protocol, concurrency and round, by (workers, model, protocol, concurrency), in round
    order."""
    one = {(p.model, p.protocol, p.concurrency, p.round_index): p
           for p in points if p.workers == 1}  # fmt: skip
    found: dict[tuple[int, str, str, int], list[float]] = {}
    for p in sorted(points, key=lambda p: p.round_index):
        base = one.get((p.model, p.protocol, p.concurrency, p.round_index))
        if p.workers > 1 and base is not None:
            key = (p.workers, p.model, p.protocol, p.concurrency)
            found.setdefault(key, []).append(p.throughput / base.throughput)
    return found


def median_points(points: Sequence[Point]) -> list[Point]:
    """Of each (workers, model, protocol, concurrency), the round of median throughput."""
    groups: dict[tuple[int, str, str, int], list[Point]] = {}
    for p in points:
        groups.setdefault((p.workers, p.model, p.protocol, p.concurrency), []).append(p)
    return [sorted(g, key=lambda p: p.throughput)[(len(g) - 1) // 2] for g in groups.values()]


def render(points: list[Point], settings: PaSettings) -> str:
    rounds = max((p.round_index for p in points), default=1)
    lines = ["# Request handling across processes (`--workers`)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    lines += [
        f"- perf_analyzer: {settings.window_ms} ms windows, stability {settings.stability} %; "
        "CPU from /proc over each point (perf_analyzer's from its resource usage), divided by "
        "the requests the server counted; machine busy: the share of all the cores' time that "
        "was busy over the point (the server, perf_analyzer and the rest); requests per "
        "frame: the requests the workers handed to the model-owning process over the point "
        "divided by the frames they travelled in (`batchserve_worker_handoffs`)",
        "- gRPC connections: "
        + (
            "one per client (`TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1`)"
            if settings.grpc_connection_per_client
            else "perf_analyzer's default, one per six clients"
        ),
    ]
    if rounds > 1:
        lines.append(
            f"- {rounds} paired rounds: a server of each worker count running throughout; "
            "within a round each point is taken on every count back to back, the order "
            "reversing from round to round"
        )
    lines += [
        "",
        "| workers | model | protocol | concurrency | round | throughput (infer/s) | "
        "model-owning process µs CPU/request | each worker µs CPU/request | perf_analyzer µs "
        "CPU/request | machine busy | requests per frame |",
        "|---|---|---|---|---:|---|---|---|---:|---:|---:|",
    ]
    for p in sorted(points, key=lambda p: (p.workers, p.model, p.protocol, p.concurrency,
                                           p.round_index)):  # fmt: skip
        each = ", ".join(f"{us:.0f}" for us in p.worker_us) or "(one process)"
        flag = "" if p.stable else " (unstable)"
        lines.append(f"| {p.workers} | {p.model} | {p.protocol} | {p.concurrency} | "
                     f"{p.round_index} | {p.throughput:,.0f}{flag} | {p.engine_us:.1f} | "
                     f"{each} | {p.load_us:.0f} | {p.machine_busy:.0%} | "
                     f"{f'{p.per_frame:.1f}' if p.worker_us else '—'} |")  # fmt: skip
    found = ratios(points)
    lines += ["", "## Ratio N workers / one process (same model, protocol, concurrency, round)",
              "", "| workers | model | protocol | concurrency | by round | median | "
              f"rounds >= {TARGET_RATIO} |", "|---|---|---|---|---|---:|---:|"]  # fmt: skip
    met = 0
    for (workers, model, protocol, concurrency), by_round in found.items():
        median = statistics.median(by_round)
        met += median >= TARGET_RATIO
        lines.append(f"| {workers} | {model} | {protocol} | {concurrency} | "
                     + ", ".join(f"{r:.2f}" for r in by_round)
                     + f" | {median:.2f} | {sum(r >= TARGET_RATIO for r in by_round)} of "
                     f"{len(by_round)} |")  # fmt: skip
    if found:
        lines += ["", f"Median ratio >= {TARGET_RATIO} at {met} of {len(found)} points."]
    lines += ["", "## Projection (not measured): node throughput from the CPU costs above", "",
              "Each figure is the least of three bounds, from the measured CPU per request "
              "(the round of median throughput): the "
              "model-owning process on one core, the `auto` workers, and every core of the node "
              "busy. It assumes the costs stay what they were here; a GPU node's faster cores "
              "and the model's own compute change them. The first bound is pessimistic: the "
              "model-owning process's cost per request falls as its load rises (workers hold "
              "their requests while it is busy, so they travel in larger groups; "
              "`MODEL_OWNER.md` measures it loaded).", "",
              "| from | model | protocol | concurrency | "
              + " | ".join(f"{c} cores (projected)" for c in PROJECTED_CORES) + " |",
              "|---|---|---|---|" + "---|" * len(PROJECTED_CORES)]  # fmt: skip
    for p in median_points(points):
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--grpc-shared-connections",
        action="store_true",
        help="perf_analyzer's default: six gRPC clients to a connection",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "WORKERS.md")
    args = parser.parse_args()
    # here, not at the top: the server's model_config.proto would clash with tritonclient's
    # in a process that imports both (the integration tests import this module)
    from bench import repo as repo_bench

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
        repo_bench.write_identity(repo)
        counts = [int(n) for n in args.workers.split(",")]
        points = paired(counts, repo, settings, Path(tmp), args.rounds)
    args.out.write_text(render(points, settings))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
