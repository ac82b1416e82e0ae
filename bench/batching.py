"""Dynamic batching on and off, under perf_analyzer: throughput and the batches that formed.

For each example model the server runs twice: with the shipped config (dynamic batching on)
and with `dynamic_batching` removed (each request runs alone). perf_analyzer drives it at
one concurrency over HTTP and gRPC; the server's own statistics give the mean batch size.

    python -m bench.batching --out bench/BATCHING.md [--concurrency 32] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import machine
from bench.common import ROOT, Point, model_stats, run_point, start_server, stop_server
from bench.repo import without_batching


@dataclass(frozen=True)
class Row:
    point: Point
    batching: bool
    mean_batch: float
    max_batch: int


def measure(
    repo: Path, model: str, batching: bool, args: argparse.Namespace, work: Path
) -> list[Row]:
    rows = []
    for protocol in ("http", "grpc"):
        server, ports = start_server(repo)
        try:
            port = ports["http_port" if protocol == "http" else "grpc_port"]
            point = run_point(
                model, protocol, port, args.concurrency, args.window_ms, work, args.stability
            )
            stats = model_stats(ports["http_port"], model)
        finally:
            stop_server(server)
        executions = max(1, int(stats["execution_count"]))
        sizes = [int(b["batch_size"]) for b in stats["batch_stats"]]
        rows.append(Row(point, batching, int(stats["inference_count"]) / executions, max(sizes)))
    return rows


def render(rows: list[Row], concurrency: int, stability: float) -> str:
    lines = [
        "# Dynamic batching on and off",
        "",
        *(f"- {line}" for line in machine.describe()),
        f"- at concurrency {concurrency} (stability {stability:g} %); client and server share "
        "the machine. Mean batch size = samples / batches from the server's statistics over "
        "the whole run.",
        "",
        "| model | protocol | batching | infer/s | p50 ms | p99 ms | mean batch | max batch "
        "| on / off |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    off = {(r.point.model, r.point.protocol): r.point.throughput for r in rows if not r.batching}
    for r in rows:
        p = r.point
        ratio = p.throughput / off[(p.model, p.protocol)] if r.batching else 1.0
        lines.append(
            f"| {p.model} | {p.protocol} | {'on' if r.batching else 'off'} | "
            f"{p.throughput:,.0f} | {p.p50_us / 1000:.2f} | {p.p99_us / 1000:.2f} | "
            f"{r.mean_batch:.1f} | {r.max_batch} | {ratio:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repo")
    parser.add_argument("--models", default="digits_cnn,char_lstm")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--stability", type=float, default=50, help="perf_analyzer stability %%")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "BATCHING.md")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for model in args.models.split(","):
            rows += measure(args.model_repository, model, True, args, work)
            unbatched = work / f"{model}-unbatched"
            without_batching(args.model_repository / model, unbatched)
            rows += measure(unbatched, model, False, args, work)
    args.out.write_text(render(rows, args.concurrency, args.stability))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
