"""Servers under measurement, started on free loopback ports, and one measured point on each.

A point is one perf_analyzer run; around it the server's own statistics (inferences,
executions) and its process tree's CPU time are read, so the figures cover the whole run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pbg

from bench import perf, procstat
from bench.common import ROOT
from bench.records import BATCHSERVE, PaRow, ServerPoint

# What takes one point: perf.run, or a load generator with its signature (bench.gpu.load.run).
Driver = Callable[
    [str, str, str, int, perf.PaSettings, Path, Sequence[str]], tuple[PaRow | None, str]
]
READY_TIMEOUT_S = 30.0
STARTUP_TIMEOUT_S = 600.0  # loading includes the memory probe and warm-up at the batch cap


@dataclass(frozen=True)
class Counts:
    """A server's statistics for one model at one moment."""

    inferences: int
    executions: int
    cap: int = 0
    succeeded: int = 0
    """Requests answered successfully, and the nanoseconds they took the server in all
    (Triton's ``inference_stats.success``)."""
    succeeded_ns: int = 0


@dataclass(frozen=True)
class Running:
    """A server process and the ports it listens on ("http" and/or "grpc", and "metrics"
    for batchserve)."""

    label: str
    process: subprocess.Popen[str]
    ports: dict[str, int]

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"

    def counts(self, model: str) -> Counts:
        """Statistics over HTTP when the server has it (Triton's JSON), else over gRPC."""
        if "http" in self.ports:
            return http_counts(self.ports["http"], model)
        return grpc_counts(self.ports["grpc"], model)


def http_counts(port: int, model: str) -> Counts:
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        return counts_from_stats(json.load(response))


def counts_from_stats(body: dict[str, Any]) -> Counts:
    """Counts from a v2 statistics body; batchserve adds its batch cap under "batchserve"."""
    stats = body["model_stats"][0]
    cap = int(stats.get("batchserve", {}).get("batch_cap", 0))
    success = stats.get("inference_stats", {}).get("success", {})
    return Counts(
        int(stats["inference_count"]), int(stats["execution_count"]), cap,
        int(success.get("count", 0)), int(success.get("ns", 0)),
    )  # fmt: skip


def grpc_counts(port: int, model: str) -> Counts:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10)
    stats = reply.model_stats[0]
    success = stats.inference_stats.success
    return Counts(
        int(stats.inference_count), int(stats.execution_count), 0, success.count, success.ns
    )


@contextmanager
def batchserve(
    repository: Path,
    model: str,
    source: Path | None = None,
    also: Sequence[str] = (),
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[Running]:
    """`batchserve serve` with only ``model`` (and ``also``, after it, in turn) loaded, as it
    ships (logging, metrics on) but for ``flags``; ``source``: a checkout whose ``server/``
    is imported instead of the installed package; ``env``: variables set for the server."""
    loads = [word for name in (model, *also) for word in ("--load-model", name)]
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--model-repository",
               str(repository), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
               "--model-control-mode", "explicit", *loads, *flags]  # fmt: skip
    environ = {**os.environ, **(env or {})}
    if source is not None:
        paths = [str(source / "server"), os.environ.get("PYTHONPATH", "")]
        environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        ports = startup(process, model)
        yield Running(BATCHSERVE, process, ports)
    finally:
        stop(process)


def startup(
    process: subprocess.Popen[str], model: str, on_line: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Ports from the server's JSON log once it is ready; the load error if it is not.

    The rest of the log is read on a thread, and handed line by line to ``on_line``.
    """
    assert process.stderr is not None
    ports: dict[str, int] = {}
    with _watchdog(process):
        for line in process.stderr:
            record = json.loads(line) if line.startswith("{") else {}
            message = record.get("message")
            if message == "listening":
                ports = {"http": int(record["http_port"]), "grpc": int(record["grpc_port"]),
                         "metrics": int(record["metrics_port"])}  # fmt: skip
            elif message == "model failed to load":
                raise RuntimeError(f"batchserve could not load {model}: {record.get('reason')}")
            elif message == "server ready" and ports:
                threading.Thread(
                    target=_follow, args=(process.stderr, on_line), daemon=True
                ).start()
                return ports
    raise RuntimeError(f"batchserve did not start for {model} (exit {process.wait()})")


def _follow(stream: IO[str], on_line: Callable[[str], None] | None) -> None:
    for line in stream:
        if on_line is not None:
            on_line(line)


@contextmanager
def _watchdog(
    process: subprocess.Popen[str], timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[None]:
    """Kill a server that is not ready within ``timeout_s``, so reading its output ends."""
    timer = threading.Timer(timeout_s, kill, (process,))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextmanager
def floor(module: str, label: str, protocol: str) -> Iterator[Running]:
    """An echo server from ``bench.floors`` on a free port."""
    command = [sys.executable, "-m", module, "--port", "0"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(wait_for_ready_line(process, module)[0])
        running = Running(label, process, {protocol: port})
        _wait_counts(running, "identity")
        yield running
    finally:
        stop(process)


def wait_for_ready_line(
    process: subprocess.Popen[str], what: str, timeout_s: float = STARTUP_TIMEOUT_S
) -> list[str]:
    """The words after ``READY`` on the process's stdout, which is drained from then on."""
    assert process.stdout is not None
    with _watchdog(process, timeout_s):
        for line in process.stdout:
            words = line.split()
            if words[:1] == ["READY"]:
                threading.Thread(target=process.stdout.read, daemon=True).start()
                return words[1:]
    raise RuntimeError(f"{what} did not start (exit {process.wait()})")


def kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL to a server, and to its whole process group when it leads one: a server that
    runs children of its own (PyTriton's tritonserver) would otherwise leave them running,
    holding its output pipe open."""
    try:
        leads_group = os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        return
    if leads_group:
        kill_group(process.pid)
    else:
        process.kill()


def kill_group(group: int) -> None:
    """SIGKILL to whatever is left of a process group (it may outlive its leader)."""
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_counts(running: Running, model: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            running.counts(model)
            return
        except (OSError, grpc.RpcError, KeyError, IndexError):
            if running.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{running.label} does not answer for {model}") from None
            time.sleep(0.1)


def measure(
    running: Running,
    model: str,
    protocol: str,
    concurrency: int,
    batching: str,
    settings: perf.PaSettings,
    work: Path,
    extra: Sequence[str] = (),
    driver: Driver | None = None,
) -> ServerPoint:
    """One perf_analyzer point (or ``driver``'s), with the server's counts and CPU over the
    whole run."""
    load, before = procstat.load1(), running.counts(model)
    cpu, start = procstat.cpu_seconds(running.process.pid), time.monotonic()
    take = driver or perf.run
    row, error = take(model, protocol, running.url(protocol), concurrency, settings, work, extra)
    cpu = procstat.cpu_seconds(running.process.pid) - cpu
    wall = time.monotonic() - start
    try:
        after = running.counts(model)
    except (OSError, grpc.RpcError) as exc:
        raise RuntimeError(f"{running.label} stopped answering: {exc}") from None
    return ServerPoint(
        running.label, model, protocol, concurrency, batching, row,
        requests=after.inferences - before.inferences,
        executions=after.executions - before.executions,
        cpu_s=cpu, wall_s=wall, load1=load, cap=after.cap, error=error,
    )  # fmt: skip
