"""The full server path without a network: digits_cnn through ``batchserve.Server`` (the
in-process API) against its ceiling, the model file in ONNX Runtime, measured in the same run.

    python -m bench.in_process [--concurrency 1,32] [--seconds 5] [--out bench/IN_PROCESS.md]

Each request carries one sample (bench/inputs.py's). N callers send requests back to back:
N asyncio tasks awaiting ``Server.infer`` on the server's own loop (uvloop, as ``serve``
runs), and N threads calling ``Server.infer_sync``, which hands each request to the server's
loop on its background thread. Everything the server does per request runs (validation,
the dynamic batcher, statistics); no bytes are encoded or sent. Batches per window come from
the model's statistics. The ceiling is ``bench/ceiling.py``'s: the same file in an ONNX
Runtime session with default options, at batch 1 and at each concurrency (the largest batch
N callers can form).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy.typing as npt
import uvloop
from batchserve.runtime.in_process import Server

from bench import ceiling, machine
from bench.common import ROOT
from bench.inputs import plan
from bench.records import CeilingPoint

MODEL = "digits_cnn"
WARM_UP_S = 1.0
CEILING_BUDGET_S = 6.0
"""ONNX Runtime time across every ceiling batch size (``ceiling.measure`` splits it)."""
Feeds = Mapping[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class Point:
    """One window: ``callers`` sending requests back to back through one API."""

    api: str  # "asyncio" or "threads"
    callers: int
    requests: int
    batches: int
    seconds: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


def ceiling_for(callers: int, ceilings: Sequence[CeilingPoint]) -> CeilingPoint:
    """The ceiling point of the largest batch ``callers`` can form (none larger exists)."""
    fitting = [c for c in ceilings if c.batch <= callers]
    if not fitting:
        raise ValueError(f"no ceiling point at batch {callers} or below")
    return max(fitting, key=lambda c: c.batch)


def _window(server: Server) -> tuple[int, int]:
    stats = server.model_statistics(MODEL)[0]
    return stats.inference_count, stats.execution_count


async def _tasks(server: Server, feeds: Feeds, callers: int, seconds: float) -> Point:
    async def caller(until: float) -> None:
        while time.perf_counter() < until:
            await server.infer(MODEL, feeds)

    await asyncio.gather(*(caller(time.perf_counter() + WARM_UP_S) for _ in range(callers)))
    before = _window(server)
    started = time.perf_counter()
    await asyncio.gather(*(caller(started + seconds) for _ in range(callers)))
    elapsed = time.perf_counter() - started
    after = _window(server)
    return Point("asyncio", callers, after[0] - before[0], after[1] - before[1], elapsed)


def _threads(server: Server, feeds: Feeds, callers: int, seconds: float) -> Point:
    def caller(start: threading.Barrier, until: list[float]) -> None:
        start.wait()
        while time.perf_counter() < until[0]:
            server.infer_sync(MODEL, feeds)

    def run(window: float) -> float:
        start, until = threading.Barrier(callers + 1), [0.0]
        with ThreadPoolExecutor(callers) as pool:
            for _ in range(callers):
                pool.submit(caller, start, until)
            until[0] = time.perf_counter() + window
            start.wait()
            began = time.perf_counter()
        return time.perf_counter() - began

    run(WARM_UP_S)
    before = _window(server)
    elapsed = run(seconds)
    after = _window(server)
    return Point("threads", callers, after[0] - before[0], after[1] - before[1], elapsed)


def _server() -> Server:
    return Server(model_repository=ROOT / "model_repo", model_control_mode="explicit",
                  load_model=[MODEL])  # fmt: skip


def _feeds(server: Server) -> dict[str, npt.NDArray[Any]]:
    return plan(MODEL, server.model_config(MODEL), {}).feeds(1)


async def _async_points(levels: Sequence[int], seconds: float) -> list[Point]:
    async with _server() as server:
        feeds = _feeds(server)
        return [await _tasks(server, feeds, n, seconds) for n in levels]


def _thread_points(levels: Sequence[int], seconds: float) -> list[Point]:
    with _server() as server:
        feeds = _feeds(server)
        return [_threads(server, feeds, n, seconds) for n in levels]


def measure_ceiling(levels: Sequence[int]) -> list[CeilingPoint]:
    with _server() as server:
        inputs = plan(MODEL, server.model_config(MODEL), {})
    batches = sorted({1, *levels})
    model_file = ROOT / "model_repo" / MODEL / "1" / "model.onnx"
    return ceiling.measure(model_file, inputs, batches, CEILING_BUDGET_S)


def render(
    points: Sequence[Point],
    ceilings: Sequence[CeilingPoint],
    seconds: float,
    load: tuple[float, float, float] | None = None,
) -> str:
    """The report; ``load``: the load average when the run began (other work on the
    machine competes for the same cores)."""
    lines = ["# The full server path without a network (`batchserve.Server`, digits_cnn)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    if load is not None:
        lines.append("- load average when the run began (1, 5, 15 min): "
                     + ", ".join(f"{value:.2f}" for value in load))  # fmt: skip
    lines += [
        f"- `python -m bench.in_process`: {seconds:.0f} s windows after {WARM_UP_S:.0f} s of "
        f"warm-up; one sample per request; callers and server share the machine's "
        f"{os.cpu_count()} cores (ONNX Runtime's instance thread, the server's event loop, and "
        "the callers)",
        "- asyncio: N tasks awaiting `Server.infer` on the server's loop; threads: N threads "
        "calling `Server.infer_sync`, each request handed to the server's loop thread",
        "- ceiling: the model file in an ONNX Runtime session (default options) at the batch N "
        "callers can form at most, measured in the same run; samples/s = batch / median call",
        "- the gap to the ceiling is the server's work per request, on one event loop, which "
        "the bare session does not do: building and validating the request, queueing it, "
        "forming and splitting the batch, statistics, and the hand-off to the instance thread "
        "and back (threads: and to the loop's thread and back); the instance also runs ONNX "
        "Runtime with the model's `intra_op_thread_count` (1), the ceiling with ORT's default",
        "",
        "| API | callers | requests/s | mean batch | ceiling batch | ceiling samples/s | "
        "share of ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        top = ceiling_for(p.callers, ceilings)
        lines.append(
            f"| {p.api} | {p.callers} | {p.throughput:,.0f} | {p.mean_batch:.1f} | {top.batch} | "
            f"{top.samples_per_s:,.0f} | {p.throughput / top.samples_per_s:.0%} |"
        )
    lines += ["", "Ceiling points: " + ", ".join(
        f"batch {c.batch}: {c.samples_per_s:,.0f} samples/s ({c.median_s * 1e6:.0f} µs median, "
        f"{c.calls} calls)" for c in ceilings
    )]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "IN_PROCESS.md")
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.concurrency.split(",")]
    load = os.getloadavg()
    ceilings = measure_ceiling(levels)
    points = uvloop.run(_async_points(levels, args.seconds))
    points += _thread_points(levels, args.seconds)
    for point in points:
        print(point, flush=True)
    args.out.write_text(render(points, ceilings, args.seconds, load))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
