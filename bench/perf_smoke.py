"""Drive a real batchserve with NVIDIA's perf_analyzer over HTTP and gRPC, briefly.

Starts `batchserve serve` on free loopback ports, runs perf_analyzer (binary tensors)
against every example model on both protocols, and writes the figures as Markdown.
The test suite runs it with short windows and checks that no request failed.

    python bench/perf_smoke.py --out bench/PERF_SMOKE.md [--concurrency 1,8] [--window-ms 2000]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

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


def start_server(repository: Path) -> tuple[subprocess.Popen[str], dict[str, int]]:
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--model-repository",
               str(repository), "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    ports: dict[str, int] = {}
    for line in process.stderr:
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("message") == "listening":
            ports = {k: int(record[k]) for k in ("http_port", "grpc_port")}
        if record.get("message") in ("server ready", "server not ready: a model failed to load"):
            break
    if not ports:
        raise SystemExit(f"server did not start (exit {process.poll()})")
    threading.Thread(target=process.stderr.read, daemon=True).start()  # keep the pipe flowing
    return process, ports


def run_point(
    model: str, protocol: str, port: int, concurrency: int, window_ms: int, work: Path
) -> Point:
    out = work / f"{model}-{protocol}-{concurrency}.csv"
    command = [
        perf_analyzer(), "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(window_ms), "--stability-percentage", "50",
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


def render(points: list[Point], load: str) -> str:
    lines = [
        "# perf_analyzer against batchserve (smoke run)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; load average at start {load}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "perf_analyzer 2.50.0, batch 1 per request, binary tensors, client and server on one "
        "machine.",
        "",
        "| model | protocol | concurrency | infer/s | p50 ms | p99 ms | server queue ms "
        "| server compute ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.model} | {p.protocol} | {p.concurrency} | {p.throughput:,.0f} | "
            f"{p.p50_us / 1000:.2f} | {p.p99_us / 1000:.2f} | {p.queue_us / 1000:.3f} | "
            f"{p.compute_us / 1000:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--models", default="digits_cnn,char_lstm")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "PERF_SMOKE.md")
    args = parser.parse_args()
    load = f"{os.getloadavg()[0]:.2f}"
    server, ports = start_server(args.model_repository)
    points: list[Point] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for model in args.models.split(","):
                for protocol, port in (("http", ports["http_port"]), ("grpc", ports["grpc_port"])):
                    for c in (int(x) for x in args.concurrency.split(",")):
                        points.append(
                            run_point(model, protocol, port, c, args.window_ms, Path(tmp))
                        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    args.out.write_text(render(points, load))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
