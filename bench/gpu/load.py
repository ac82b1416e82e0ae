"""Closed-loop load over HTTP or gRPC where perf_analyzer does not run: throughput, p50, p99.

``c`` clients each send one request (batch 1, binary tensors), wait for the answer and send
the next, spread over a few forked processes so that the client's Python is not the
bottleneck. As perf_analyzer does, each process encodes the request once (with the
project's client, as it would send it) and then only writes and reads sockets: a raw
HTTP/1.1 connection per client, one gRPC channel per process. Every process counts the answers that
arrive inside one shared wall-clock window after a warm-up; requests never stop before the
window ends and nothing runs past it plus a drain of ``DRAIN_S``. Loopback only.

    python -m bench.gpu.load --url grpc://127.0.0.1:8001 --model m --inputs x.npz \
        --concurrency 16 --window-s 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, running_on
from bench.inputs import ModelInputs
from bench.perf import PaSettings
from bench.records import PaRow

WARMUP_S = 0.5
START_S = 1.0  # forking the clients and importing their libraries (after the parent's own)
DRAIN_S = 30.0
TIMEOUT_S = 30.0
MAX_PROCS = 4
SCHEMES = {"http": "http", "grpc": "grpc"}


def shares(concurrency: int, procs: int) -> list[int]:
    """``concurrency`` clients over at most ``procs`` processes, as evenly as possible."""
    count = max(1, min(concurrency, procs))
    base, extra = divmod(concurrency, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def summarise(parts: Sequence[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """One point from every process's answers: any failed request fails the point."""
    errors = sum(int(p["errors"]) for p in parts)
    latencies = np.array([s for p in parts for s in p["latencies"]], dtype=np.float64)
    if errors:
        first = next(p["error"] for p in parts if p["errors"])
        return {"error": f"{errors} requests failed; the first: {first}"}
    if latencies.size == 0:
        return {"error": f"no answer arrived within the {window_s:g} s window"}
    return {
        "throughput": latencies.size / window_s,
        "p50_us": float(np.percentile(latencies, 50)) * 1e6,
        "p99_us": float(np.percentile(latencies, 99)) * 1e6,
        "requests": int(latencies.size),
    }


class _Http:
    """One kept-alive HTTP/1.1 connection sending the same encoded request again and again."""

    def __init__(self, url: str, model: str, body: bytes, headers: dict[str, str]) -> None:
        self.host, _, port = url.partition("://")[2].rpartition(":")
        self.port = int(port)
        lines = [
            f"POST /v2/models/{model}/infer HTTP/1.1",
            f"Host: {self.host}",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self) -> None:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        status, length = _status_and_length(head)
        body = await reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

    async def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


def _status_and_length(head: bytes) -> tuple[int, int]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return status, int(value)
    raise RuntimeError(f"HTTP {status} answer without Content-Length")


class _Grpc:
    """ModelInfer with the request serialised once; the answer is checked, not decoded."""

    def __init__(self, url: str, payload: bytes, own_connection: bool = False) -> None:
        """``own_connection``: a connection of its own, not the one grpc shares between the
        process's channels to the same address."""
        import grpc

        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        self.channel = grpc.aio.insecure_channel(url.partition("://")[2], options=options)
        # No serializers: the payload goes out as it is, the answer comes back as bytes.
        self.call = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer", None, None
        )
        self.payload = payload

    async def send(self) -> None:
        answer = await self.call(self.payload, timeout=TIMEOUT_S)
        if not answer:
            raise RuntimeError("empty ModelInfer answer")

    async def close(self) -> None:
        await self.channel.close(None)


def _senders(
    url: str, model: str, inputs: dict[str, Any], clients: int, grpc_each: bool = False
) -> list[Any]:
    """One sender per client (HTTP: a connection each) or one shared channel (gRPC; with
    ``grpc_each``, a channel and connection per client), with the request encoded once by the
    project's client, as it would send it."""
    from batchserve_client import _grpc, _http
    from batchserve_client._infer import build_request

    request = build_request(model, inputs)
    if url.startswith("grpc://"):
        payload = _grpc.encode_infer(request).SerializeToString()
        if grpc_each:
            return [_Grpc(url, payload, own_connection=True) for _ in range(clients)]
        return [_Grpc(url, payload)] * clients
    body, headers = _http.encode_infer(request, binary=True)
    return [_Http(url, model, body, headers) for _ in range(clients)]


async def _drive(
    url: str,
    model: str,
    inputs: dict[str, Any],
    clients: int,
    start: float,
    end: float,
    grpc_each: bool = False,
) -> dict[str, Any]:
    latencies: list[float] = []
    failed: list[str] = []

    async def client_loop(sender: Any) -> None:
        while time.time() < end:
            began = time.perf_counter()
            try:
                await sender.send()
            except Exception as exc:  # every failure counts; the point then fails
                failed.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.01)
                continue
            if start <= time.time() <= end:
                latencies.append(time.perf_counter() - began)

    senders = _senders(url, model, inputs, clients, grpc_each)
    try:
        await asyncio.gather(*(client_loop(sender) for sender in senders))
    finally:
        for sender in dict.fromkeys(senders):
            await sender.close()
    return {"latencies": latencies, "errors": len(failed), "error": failed[0] if failed else ""}


def _worker(task: tuple[str, str, str, int, float, float, bool]) -> dict[str, Any]:
    url, model, path, clients, start, end, grpc_each = task
    with np.load(path) as data:
        inputs = {name: data[name] for name in data.files}
    driving = _drive(url, model, inputs, clients, start, end, grpc_each)
    try:
        import uvloop

        return uvloop.run(driving)
    except ImportError:
        return asyncio.run(driving)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    procs = args.procs or max(1, min(MAX_PROCS, (os.cpu_count() or 1) // 4))
    start = time.time() + START_S + args.warmup_s
    end = start + args.window_s
    tasks = [
        (args.url, args.model, args.inputs, n, start, end, args.grpc_connection_per_client)
        for n in shares(args.concurrency, procs)
    ]
    with multiprocessing.get_context("fork").Pool(len(tasks)) as pool:
        pending = pool.map_async(_worker, tasks, chunksize=1)
        try:
            parts = pending.get(timeout=end - time.time() + DRAIN_S)
        except multiprocessing.TimeoutError:
            return {"error": f"clients still waiting {DRAIN_S:g} s after the window"}
    return summarise(parts, args.window_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.load", description=__doc__)
    parser.add_argument("--url", required=True, help="http://HOST:PORT or grpc://HOST:PORT")
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True, help=".npz: one sample per input, batch 1")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--window-s", type=float, default=2.0)
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S)
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help=f"client processes (default: a quarter of the cores, at most {MAX_PROCS})",
    )
    parser.add_argument(
        "--grpc-connection-per-client",
        action="store_true",
        help="a gRPC channel and connection per client (default: one per process)",
    )
    args = parser.parse_args(argv)
    host = args.url.partition("://")[2].rpartition(":")[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        parser.error("the load generator only targets loopback addresses")
    print(json.dumps(measure(args)))
    return 0


# The driver the benchmark calls, with perf.run's signature.


def write_inputs(inputs: ModelInputs, work: Path) -> list[str]:
    """The request sample as .npz (batch axis of 1), and the argument that passes it."""
    path = work / f"load-{inputs.model}.npz"
    arrays: dict[str, Any] = dict(inputs.feeds(1))
    np.savez(path, **arrays)
    return ["--inputs", str(path)]


def command(
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    settings: PaSettings,
    extra: Sequence[str] = (),
) -> list[str]:
    """This module's command line for one point, asked what ``settings`` asks of
    perf_analyzer where it applies (a gRPC connection per client)."""
    own = ["--grpc-connection-per-client"] if settings.grpc_connection_per_client else []
    return [sys.executable, "-m", "bench.gpu.load", "--url", f"{SCHEMES[protocol]}://{url}",
            "--model", model, "--concurrency", str(concurrency),
            "--window-s", f"{settings.window_ms / 1000:g}", *own, *extra]  # fmt: skip


def run(
    model: str,
    protocol: str,
    url: str,
    concurrency: int,
    settings: PaSettings,
    work: Path,
    extra: Sequence[str] = (),
) -> tuple[PaRow | None, str]:
    """One point: the row, or None and why."""
    argv = command(model, protocol, url, concurrency, settings, extra)
    limit = START_S + WARMUP_S + settings.window_ms / 1000 + DRAIN_S + 30
    try:
        with running_on(settings.cpus):
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"the load generator did not finish within {limit:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None, (done.stdout + done.stderr)[-1200:]
    found = json.loads(lines[-1])
    if "error" in found:
        return None, str(found["error"])
    return PaRow(found["throughput"], found["p50_us"], found["p99_us"], 0.0, 0.0), ""


@dataclass(frozen=True)
class LoadTool:
    """What drives the served points: perf_analyzer where it runs, else this module."""

    name: str
    description: str

    @property
    def own(self) -> bool:
        return self.name != "perf_analyzer"

    def driver(self) -> Any:
        if self.own:
            return run
        from bench import perf

        return perf.run

    def extra(self, inputs: ModelInputs, work: Path) -> list[str]:
        return write_inputs(inputs, work) if self.own else inputs.pa_args(work)

    def settings(self, window_s: float) -> PaSettings:
        return PaSettings(int(window_s * 1000), max_trials=4)

    def point_s(self, window_s: float) -> float:
        """Seconds one point is planned to take."""
        if self.own:
            return START_S + WARMUP_S + window_s + 1.0
        return 4 * window_s + 2.0


def perf_analyzer_problem() -> str:
    """Why perf_analyzer cannot drive the points here ("" when its binary runs)."""
    from bench.common import perf_analyzer

    try:
        binary = perf_analyzer()
    except SystemExit as exc:
        return str(exc)
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} --version: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        return f"perf_analyzer --version exited {done.returncode}: {lines[-1]}"
    return ""


def choose(wanted: str) -> tuple[LoadTool, str]:
    """The tool asked for ("auto": perf_analyzer when it runs), and why not the other."""
    problem = perf_analyzer_problem() if wanted != "own" else "not asked for (--load own)"
    if wanted != "own" and not problem:
        from bench.machine import perf_analyzer_origin

        return LoadTool("perf_analyzer", f"perf_analyzer: {perf_analyzer_origin()}"), ""
    if wanted == "perf_analyzer":
        raise SystemExit(f"--load perf_analyzer: {problem}")
    own = LoadTool(
        "bench.gpu.load",
        "load: bench.gpu.load (closed loop, batch 1, binary tensors encoded once by "
        "batchserve_client; raw HTTP/1.1 connections and one grpc.aio channel per client "
        f"process, up to {MAX_PROCS}); perf_analyzer not used: {problem}",
    )
    return own, problem


if __name__ == "__main__":
    sys.exit(main())
