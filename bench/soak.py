"""Soak: a real server under sustained mixed load, with a PASS/FAIL verdict on its health.

Starts batchserve on free loopback ports and drives it for ``--duration`` seconds from
several asyncio workers at a steady total rate: good requests to every model over HTTP
(binary and JSON) and gRPC, each answer checked against ONNX Runtime's, and a share of
malformed requests that must be refused with the right 4xx status or gRPC code. The
server's resident memory is sampled every few seconds and latency summarised per window.

PASS needs: no unexpected answer (a failed or wrong good request, a bad one answered,
refused with a 5xx or with the wrong code), no ERROR record in the server's log, the
server alive to the end and stopping cleanly, RSS growth after the warm-up under
max(5 %, 16 MiB), and no gross p99 drift (see ``bench/soak_stats.py``). Exit status 0 on
PASS, 1 on FAIL.

    python -m bench.soak [--duration 600] [--warmup 60] [--rate 100] [--leaky]

``--leaky`` serves through ``bench/leaky_server.py``, whose ``digits_cnn`` keeps 64 KiB
per batch: that run must FAIL on memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench import machine, procstat, servers
from bench.common import ROOT
from bench.soak_load import Clients, Mix, build_mix
from bench.soak_stats import (
    MIB,
    P99_DRIFT_RATIO,
    Check,
    RssSample,
    Window,
    alive_check,
    drift_check,
    errors_check,
    latency_windows,
    log_check,
    memory_check,
    rss_check,
)

MODELS = ("digits_cnn", "char_lstm")
KEPT_MESSAGES = 3  # per case, the first few unexpected answers are quoted in the report
ERROR_LEVELS = ("ERROR", "CRITICAL")
RSS_TABLE_ROWS = 20


@dataclass
class Tally:
    """What the workers saw: requests and surprises per case, good requests' latencies."""

    sent: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    messages: dict[str, list[str]] = field(default_factory=dict)
    latencies: list[tuple[float, float]] = field(default_factory=list)

    def record(self, name: str, good: bool, t: float, seconds: float, error: str | None) -> None:
        self.sent[name] += 1
        if error is not None:
            self.unexpected[name] += 1
            kept = self.messages.setdefault(name, [])
            if len(kept) < KEPT_MESSAGES:
                kept.append(error)
        elif good:
            self.latencies.append((t, seconds))


@dataclass
class ServerLog:
    """The server's log records after startup, by level, and the first errors in full."""

    levels: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def __call__(self, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            record = {"level": "UNPARSED", "message": line.strip()}
        level = str(record.get("level", "UNKNOWN"))
        self.levels[level] += 1
        if level in ERROR_LEVELS and len(self.errors) < KEPT_MESSAGES:
            exc = str(record.get("exc_info", "")).strip().splitlines()
            self.errors.append(f"{record.get('message')}{': ' + exc[-1] if exc else ''}")

    @property
    def error_count(self) -> int:
        return sum(self.levels[level] for level in ERROR_LEVELS)


@dataclass
class Run:
    """One soak's inputs and everything it measured."""

    args: argparse.Namespace
    mix: Mix
    tally: Tally = field(default_factory=Tally)
    log: ServerLog = field(default_factory=ServerLog)
    rss: list[RssSample] = field(default_factory=list)
    elapsed: float = 0.0
    died: int | None = None  # exit status if the server ended during the load
    stop_code: int | None = None
    unanswered: str = ""  # why the statistics could not be read after the load
    counts: dict[str, servers.Counts] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    cpu: tuple[float, float] = (0.0, 0.0)  # seconds used over the load: server, this client


async def worker(run: Run, clients: Clients, seed: int, t0: float, halt: asyncio.Event) -> None:
    """Requests at ``rate / workers`` per second until the end (closed-loop when behind)."""
    rng = random.Random(seed)
    interval = run.args.workers / run.args.rate
    due = time.monotonic()
    end = t0 + run.args.duration
    while not halt.is_set() and time.monotonic() < end:
        case = run.mix.pick(rng)
        start = time.monotonic()
        try:
            error = await case.send(clients, rng)
        except Exception as exc:  # a surprise in the client is an unexpected answer too
            error = f"{type(exc).__name__} in the soak client: {exc}"
        done = time.monotonic()
        run.tally.record(case.name, case.good, done - t0, done - start, error)
        due = max(due + interval, done)
        await asyncio.sleep(due - done)


async def watch_memory(
    run: Run, process: subprocess.Popen[str], t0: float, halt: asyncio.Event
) -> None:
    """RSS every ``--sample-every`` seconds; stops the load if the server has died."""
    end = t0 + run.args.duration
    while True:
        now = time.monotonic()
        if process.poll() is not None:
            run.died = process.returncode
            halt.set()
            return
        if halt.is_set() or now >= end:
            return
        with contextlib.suppress(OSError, ValueError):  # gone since poll(): seen next turn
            run.rss.append(RssSample(now - t0, procstat.rss_bytes(process.pid)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), min(run.args.sample_every, end - now))


async def drive(run: Run, process: subprocess.Popen[str], ports: dict[str, int]) -> None:
    clients = Clients(ports["http"], ports["grpc"])
    halt = asyncio.Event()
    server_cpu, client_cpu = procstat.cpu_seconds(process.pid), time.process_time()
    t0 = time.monotonic()
    try:
        workers = [worker(run, clients, run.args.seed + i, t0, halt)
                   for i in range(run.args.workers)]  # fmt: skip
        memory = asyncio.create_task(watch_memory(run, process, t0, halt))
        await asyncio.gather(*workers)
        halt.set()
        await memory
        if run.died is None:  # the last sample, taken with the load just finished
            with contextlib.suppress(OSError, ValueError):
                run.rss.append(RssSample(time.monotonic() - t0, procstat.rss_bytes(process.pid)))
    finally:
        run.elapsed = time.monotonic() - t0
        server_cpu = procstat.cpu_seconds(process.pid) - server_cpu
        run.cpu = (server_cpu, time.process_time() - client_cpu)
        await clients.close()


def server_command(args: argparse.Namespace) -> list[str]:
    module = ["bench.leaky_server", "--leak-kib", str(args.leak_kib)] if args.leaky else [
        "batchserve.cli", "serve"]  # fmt: skip
    return [sys.executable, "-m", *module, "--model-repository", str(args.model_repository),
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]  # fmt: skip


def soak(args: argparse.Namespace) -> Run:
    """Start the server, load it, read its statistics, stop it."""
    mix = build_mix(args.model_repository, args.models, args.bad_fraction, args.seed, args.pool)
    run = Run(args, mix)
    load_before = procstat.load1()
    process = subprocess.Popen(server_command(args), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        ports = servers.startup(process, ",".join(args.models), run.log)
        uvloop.run(drive(run, process, ports))
        if run.died is None:
            try:
                run.counts = {m: servers.http_counts(ports["http"], m) for m in args.models}
            except OSError as error:
                run.unanswered = f"statistics request: {error!r}"
    finally:
        servers.stop(process)
    run.stop_code = process.returncode
    run.load = (load_before, procstat.load1())
    return run


def checks(run: Run, windows: list[Window]) -> list[Check]:
    total = sum(run.tally.sent.values())
    found = [errors_check(sum(run.tally.unexpected.values()), total)]
    found.append(alive_check(run.died, run.stop_code, run.unanswered))
    found.append(log_check(run.log.error_count, run.log.errors))
    if run.died is None:
        found.append(memory_check(rss_check(run.rss, run.args.warmup)))
        found.append(drift_check(windows, run.args.max_p99_drift))
    return found


def render(run: Run, windows: list[Window], verdict: list[Check]) -> str:
    args, tally = run.args, run.tally
    passed = all(c.passed for c in verdict)
    total = sum(tally.sent.values())
    server = (f"`bench/leaky_server.py` (`digits_cnn` keeps {args.leak_kib} KiB per batch)"
              if args.leaky else "`batchserve serve`")  # fmt: skip
    lines = [
        "# Soak" + (": leaking model" if args.leaky else ""),
        "",
        *(f"{line}  " for line in machine.describe() if not line.startswith("perf_analyzer")),
        f"Command: `{' '.join(['python -m bench.soak', *sys.argv[1:]])}`  ",
        f"Server: {server} on loopback, models {', '.join(args.models)}, shipped configs.  ",
        f"Load: {args.workers} asyncio workers at {args.rate:g} requests/s in all "
        f"(achieved {total / max(run.elapsed, 1e-9):,.1f}/s), {args.bad_fraction:.0%} malformed; "
        f"{run.elapsed:.0f} s, of which {args.warmup:g} s warm-up.  ",
        f"CPU over the load: server {run.cpu[0]:.0f} s, soak client {run.cpu[1]:.0f} s "
        f"({os.cpu_count()} CPUs shared by both). Load average (1 min): {run.load[0]:.2f} "
        f"at start, {run.load[1]:.2f} at end.",
        "",
        f"## Verdict: {'PASS' if passed else 'FAIL'}",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'PASS' if c.passed else 'FAIL'} | {c.detail} |" for c in verdict),
        "",
        *requests_table(run),
        *latency_table(windows),
        *rss_table(run),
        *stats_table(run),
        *log_table(run.log),
    ]
    return "\n".join(lines) + "\n"


def requests_table(run: Run) -> list[str]:
    tally = run.tally
    lines = ["## Requests by class", "", "| class | expected | sent | unexpected |",
             "|---|---|---:|---:|"]  # fmt: skip
    for case in run.mix.cases:
        expected = "correct answer" if case.good else "refused (4xx / gRPC code)"
        lines.append(f"| {case.name} | {expected} | {tally.sent[case.name]:,} | "
                     f"{tally.unexpected[case.name]:,} |")  # fmt: skip
    for name, messages in tally.messages.items():
        lines += ["", f"Unexpected answers to {name} (first {len(messages)}):", ""]
        lines += [f"- {message}" for message in messages]
    return [*lines, ""]


def latency_table(windows: list[Window]) -> list[str]:
    lines = ["## Latency of good requests per window", "",
             "| window (s) | requests | p50 ms | p99 ms |", "|---|---:|---:|---:|"]  # fmt: skip
    for w in windows:
        label = f"{w.start:.0f}-{w.end:.0f}" + (" (warm-up)" if w.warmup else "")
        lines.append(f"| {label} | {w.count:,} | {w.p50 * 1000:.2f} | {w.p99 * 1000:.2f} |")
    return [*lines, ""]


def rss_table(run: Run) -> list[str]:
    samples = run.rss
    step = max(1, len(samples) // RSS_TABLE_ROWS)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    lines = [f"## Server RSS ({len(samples)} samples, every {run.args.sample_every:g} s)", "",
             "| t (s) | RSS MiB |", "|---:|---:|"]  # fmt: skip
    for s in shown:
        mark = " (warm-up)" if s.t < run.args.warmup else ""
        lines.append(f"| {s.t:.0f}{mark} | {s.rss / MIB:.1f} |")
    return [*lines, ""]


def stats_table(run: Run) -> list[str]:
    if not run.counts:
        return []
    lines = ["## Server statistics at the end", "",
             "| model | inferences | executions | mean batch | batch cap |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for model, c in run.counts.items():
        mean = c.inferences / c.executions if c.executions else 0.0
        lines.append(f"| {model} | {c.inferences:,} | {c.executions:,} | {mean:.2f} | {c.cap} |")
    return [*lines, ""]


def log_table(log: ServerLog) -> list[str]:
    levels = ", ".join(f"{level} {count:,}" for level, count in sorted(log.levels.items()))
    lines = ["## Server log after startup", "", f"Records by level: {levels or 'none'}."]
    if log.errors:
        lines += ["", f"First {len(log.errors)} ERROR records:", ""]
        lines += [f"- {message}" for message in log.errors]
    return [*lines, ""]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before the memory baseline (default: 10%% of the "
                             "duration, at least 10 s)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s, all workers")
    parser.add_argument("--workers", type=int, default=8, help="concurrent asyncio workers")
    parser.add_argument("--bad-fraction", type=float, default=0.1, help="share of bad requests")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per latency window")
    parser.add_argument("--max-p99-drift", type=float, default=P99_DRIFT_RATIO,
                        help="fail when the last window's p99 is over this many times the "
                             "first's after the warm-up")  # fmt: skip
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS")
    parser.add_argument("--leaky", action="store_true", help="serve a model that leaks")
    parser.add_argument("--leak-kib", type=int, default=64, help="with --leaky: KiB per batch")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--pool", type=int, default=32, help="distinct inputs per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None,
                        help="Markdown result (default bench/SOAK.md, or bench/SOAK_LEAKY.md "
                             "with --leaky)")  # fmt: skip
    args = parser.parse_args(argv)
    args.models = MODELS
    if args.warmup is None:
        args.warmup = max(10.0, 0.1 * args.duration)
    if not 0 < args.warmup < args.duration:
        parser.error("--warmup must be shorter than --duration")
    if args.output is None:
        args.output = ROOT / "bench" / ("SOAK_LEAKY.md" if args.leaky else "SOAK.md")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = soak(args)
    windows = latency_windows(run.tally.latencies, args.warmup, run.elapsed, args.window)
    verdict = checks(run, windows)
    args.output.write_text(render(run, windows, verdict))
    for check in verdict:
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    passed = all(c.passed for c in verdict)
    print(f"soak {'PASS' if passed else 'FAIL'}; result in {args.output}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
