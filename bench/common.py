"""Shared pieces of the benchmark scripts: a real server on free ports, perf_analyzer runs."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
# Realistic inputs where random ones would be meaningless (token ids, true lengths).
INPUT_DATA = {
    "char_lstm": {
        "data": [{"tokens": {"content": list(range(3, 35)), "shape": [32]}, "lengths": [32]}]
    },
}
SHAPES = {"char_lstm": ["tokens:32"]}


@dataclass(frozen=True)
class Point:
    model: str
    protocol: str
    concurrency: int
    throughput: float
    p50_us: float
    p99_us: float
    queue_us: float
    compute_us: float


def perf_analyzer() -> str:
    found = shutil.which("perf_analyzer", path=str(Path(sys.executable).parent)) or shutil.which(
        "perf_analyzer"
    )
    if found is None:
        raise SystemExit("perf_analyzer not found: run scripts/install_perf_analyzer.sh")
    return found


@contextmanager
def running_on(cpus: Collection[int]) -> Iterator[None]:
    """Processes this thread starts inside run on ``cpus`` (empty: wherever this thread may):
    the thread's own affinity is set for the while, and restored after. A child inherits the
    affinity of the thread that starts it, so no ``preexec_fn`` (unsafe once threads run) and
    no ``taskset`` binary are needed."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_server(
    repository: Path, extra_args: tuple[str, ...] = (), cpus: Collection[int] = ()
) -> tuple[subprocess.Popen[str], dict[str, int]]:
    """`batchserve serve` on free loopback ports, on ``cpus`` (empty: any this process may
    use), its workers too; returns once every model has loaded."""
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--model-repository",
               str(repository), "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", *extra_args]  # fmt: skip
    with running_on(cpus):
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    ports: dict[str, int] = {}
    for line in process.stderr:
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("message") == "listening":
            ports = {k: int(record[k]) for k in ("http_port", "grpc_port", "metrics_port")}
        if record.get("message") in ("server ready", "server not ready: a model failed to load"):
            break
    if not ports:
        raise SystemExit(f"server did not start (exit {process.poll()})")
    threading.Thread(target=_drain, args=(process.stderr,), daemon=True).start()
    return process, ports


def run_point(
    model: str,
    protocol: str,
    port: int,
    concurrency: int,
    window_ms: int,
    work: Path,
    stability: float = 50,
) -> Point:
    out = work / f"{model}-{protocol}-{concurrency}.csv"
    command = [
        perf_analyzer(), "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(window_ms), "--stability-percentage", str(stability),
        "--max-trials", "6", "-f", str(out),
    ]  # fmt: skip
    for shape in SHAPES.get(model, []):
        command += ["--shape", shape]
    if model in INPUT_DATA:
        data = work / f"{model}.json"
        data.write_text(json.dumps(INPUT_DATA[model]))
        command += ["--input-data", str(data)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(
            f"perf_analyzer failed for {model}/{protocol}:\n{result.stdout}\n{result.stderr}"
        )
    with out.open() as handle:
        row = next(csv.DictReader(handle))
    return Point(
        model, protocol, concurrency, float(row["Inferences/Second"]),
        float(row["p50 latency"]), float(row["p99 latency"]),
        float(row["Server Queue"]), float(row["Server Compute Infer"]),
    )  # fmt: skip


def _drain(stream: IO[str]) -> None:
    """Keep the server's log pipe flowing, and close it once the server has gone."""
    with stream:
        for _ in stream:
            pass


def stop_server(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)


def model_stats(http_port: int, model: str) -> dict[str, Any]:
    """The server's Triton-style statistics of one model."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        return dict(json.load(response)["model_stats"][0])


def metric_total(port: int, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` on a metrics port whose labels include ``labels``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
