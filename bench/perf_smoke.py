"""Drive a real batchserve with NVIDIA's perf_analyzer over HTTP and gRPC, briefly.

Starts `batchserve serve` on free loopback ports, runs perf_analyzer (binary tensors)
against every example model on both protocols, and writes the figures as Markdown.
The test suite runs it with short windows and checks that no request failed.

    python bench/perf_smoke.py --out bench/PERF_SMOKE.md [--concurrency 1,8] [--window-ms 2000]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import tempfile
import time
from pathlib import Path

from common import ROOT, Point, run_point, start_server


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
    parser.add_argument(
        "--stability", type=float, default=50,
        help="perf_analyzer --stability-percentage; a huge value accepts any window (smoke tests)",
    )  # fmt: skip
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
                            run_point(
                                model, protocol, port, c, args.window_ms, Path(tmp), args.stability
                            )
                        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    args.out.write_text(render(points, load))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
