"""Images sent as bytes: request size and throughput of resnet18ish taking FP32 NCHW floats or
UINT8 NHWC bytes (cast, layout and normalisation baked into the graph), over HTTP and gRPC.

Exports ``bench.models:resnet18ish`` twice through the real ``batchserve export`` (FP32, and
UINT8 with ``--normalize``), serves both from one batchserve, and measures each with
perf_analyzer (batch 1 per request, binary tensors, its random data) in rounds, the models
taking turns at each point. Writes bench/IMAGE_BYTES.md.

    python -m bench.image_bytes [--concurrency 1,4] [--rounds 3] [--window-ms 2000] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from batchserve.proto import grpc_service_pb2 as pb

from bench import machine, perf, procstat, repo, servers
from bench.common import ROOT
from bench.records import BATCHSERVE, PaRow, ServerPoint

UINT8 = f"{repo.RESNET}_uint8"
UINT8_IMAGE = (
    "--input", "image:UINT8:batch,224,224,3",
    "--normalize", "mean=0.485,0.456,0.406", "std=0.229,0.224,0.225",
)  # fmt: skip
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class Variant:
    """One export of the model: its name, how it is exported, and one request's input."""

    model: str
    export: tuple[str, ...]
    datatype: str
    shape: tuple[int, ...]  # one image, batch of 1 included

    def zeros(self) -> np.ndarray:
        return np.zeros(self.shape, dtype=np.uint8 if self.datatype == "UINT8" else np.float32)


VARIANTS = (
    Variant(repo.RESNET, repo.FP32_IMAGE, "FP32", (1, 3, 224, 224)),
    Variant(UINT8, UINT8_IMAGE, "UINT8", (1, 224, 224, 3)),
)


@dataclass(frozen=True)
class Measured:
    """One model at one protocol and concurrency: a point per round."""

    variant: Variant
    protocol: str
    concurrency: int
    request_bytes: int
    points: tuple[ServerPoint, ...]

    def median(self, figure: Callable[[ServerPoint], float]) -> float:
        """The median over the rounds that produced a figure (NaN when none did)."""
        values = [figure(p) for p in self.points if p.row is not None]
        return statistics.median(values) if values else math.nan


def http_request_bytes(variant: Variant) -> int:
    """The HTTP body tritonclient sends for one image: a JSON header, then the tensor's bytes."""
    import tritonclient.http as httpclient  # type: ignore[import-untyped]

    array = variant.zeros()
    tensor = httpclient.InferInput("image", list(array.shape), variant.datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    body, _ = httpclient.InferenceServerClient.generate_request_body([tensor])
    return len(body)


def grpc_request_bytes(variant: Variant) -> int:
    """The ModelInferRequest for one image, its tensor in ``raw_input_contents`` as
    perf_analyzer and tritonclient send it."""
    array = variant.zeros()
    request = pb.ModelInferRequest(model_name=variant.model)
    request.inputs.add(name="image", datatype=variant.datatype, shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request.ByteSize()


REQUEST_BYTES = {"http": http_request_bytes, "grpc": grpc_request_bytes}


def render(header: Sequence[str], measured: Sequence[Measured], notes: Sequence[str]) -> str:
    """The results file: machine, one row per model and point, and the UINT8/FP32 ratios."""
    rounds = max((len(m.points) for m in measured), default=0)
    lines = ["# Images sent as bytes: FP32 vs UINT8 input", "", *(f"- {h}" for h in header), ""]
    lines += [
        f"Medians of {rounds} rounds; infer/s also gives the range over the rounds.",
        "",
        "| model | input (one image) | protocol | request bytes | concurrency | infer/s "
        "| p50 ms | p99 ms | server CPU ms/infer | load1 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in measured:
        shape = "x".join(map(str, m.variant.shape[1:]))
        speeds = [p.throughput for p in m.points if p.row is not None]
        spread = f" ({min(speeds):.1f}-{max(speeds):.1f})" if len(speeds) > 1 else ""
        loads = [p.load1 for p in m.points]
        lines.append(
            f"| {m.variant.model} | {m.variant.datatype} {shape} | {m.protocol} | "
            f"{m.request_bytes:,} | {m.concurrency} | "
            f"{m.median(lambda p: p.throughput):.1f}{spread} | "
            f"{m.median(lambda p: _row(p).p50_us) / 1000:.1f} | "
            f"{m.median(lambda p: _row(p).p99_us) / 1000:.1f} | "
            f"{m.median(lambda p: p.cpu_us_per_request) / 1000:.1f} | "
            f"{min(loads):.2f}-{max(loads):.2f} |"
        )
    failures = [f"{p.model} {p.protocol} c={p.concurrency}: {p.error}" for p in _failed(measured)]
    lines += ["", *ratios(measured), "", *(f"- {note}" for note in [*notes, *failures])]
    return "\n".join(lines) + "\n"


def _row(point: ServerPoint) -> PaRow:
    assert point.row is not None  # Measured.median reads rows only where there is one
    return point.row


def _failed(measured: Sequence[Measured]) -> list[ServerPoint]:
    return [p for m in measured for p in m.points if p.row is None]


def ratios(measured: Sequence[Measured]) -> list[str]:
    """UINT8 over FP32 per protocol and concurrency: request bytes, and the median over the
    rounds of each round's throughput and server CPU ratios (the two taken back to back)."""
    lines = [
        "| protocol | concurrency | request bytes UINT8/FP32 | throughput UINT8/FP32 "
        "| server CPU per inference UINT8/FP32 |",
        "|---|---:|---:|---:|---:|",
    ]
    by_key = {(m.variant.datatype, m.protocol, m.concurrency): m for m in measured}
    for (datatype, protocol, concurrency), fp32 in by_key.items():
        uint8 = by_key.get(("UINT8", protocol, concurrency))
        if datatype != "FP32" or uint8 is None:
            continue  # each FP32 entry with the UINT8 one beside it
        pairs = [(f, u) for f, u in zip(fp32.points, uint8.points, strict=False) if f.row and u.row]
        speed = _median_ratio([(u.throughput, f.throughput) for f, u in pairs])
        cpu = _median_ratio([(u.cpu_us_per_request, f.cpu_us_per_request) for f, u in pairs])
        size = uint8.request_bytes / fp32.request_bytes
        lines.append(f"| {protocol} | {concurrency} | {size:.3f} | {speed} | {cpu} |")
    return lines


def _median_ratio(pairs: Sequence[tuple[float, float]]) -> str:
    values = [a / b for a, b in pairs if b and math.isfinite(a) and math.isfinite(b)]
    if not values:
        return "n/a"
    spread = f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""
    return f"{statistics.median(values):.2f}{spread}"


def measure_all(
    repository: Path,
    concurrencies: Sequence[int],
    rounds: int,
    settings: perf.PaSettings,
    work: Path,
) -> list[Measured]:
    """Both models from one server, in rounds; in a round, at each point the two take turns
    (FP32 first), so each pair shares the minute's speed of a shared machine."""
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--model-repository",
               str(repository), "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    points: dict[tuple[Variant, str, int], list[ServerPoint]] = {}
    try:
        ports = servers.startup(process, " and ".join(v.model for v in VARIANTS))
        running = servers.Running(BATCHSERVE, process, ports)
        for number in range(1, rounds + 1):
            for concurrency in concurrencies:
                for protocol in PROTOCOLS:
                    for variant in VARIANTS:
                        point = servers.measure(
                            running, variant.model, protocol, concurrency, "on", settings, work
                        )
                        points.setdefault((variant, protocol, concurrency), []).append(point)
                        print(
                            f"round {number}: {variant.model} {protocol} c={concurrency}: "
                            f"{point.throughput:.1f}/s",
                            flush=True,
                        )
    finally:
        servers.stop(process)
    return [
        Measured(variant, protocol, c, REQUEST_BYTES[protocol](variant), tuple(taken))
        for (variant, protocol, c), taken in points.items()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image_bytes", description=__doc__)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--max-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "IMAGE_BYTES.md")
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the notes (repeatable)"
    )
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    settings = perf.PaSettings(args.window_ms, max_trials=args.max_trials)
    header = machine.describe()
    header.append(f"1-minute load average at the start: {procstat.load1():.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-image-bytes-") as tmp:
        repository = Path(tmp) / "repo"
        for variant in VARIANTS:
            repo.export_resnet(repository, variant.model, variant.export)
        measured = measure_all(repository, concurrencies, args.rounds, settings, Path(tmp))
    notes = [
        f"Command: `python -m bench.image_bytes --concurrency {args.concurrency} --rounds "
        f"{args.rounds} --window-ms {args.window_ms} --max-trials {args.max_trials}`.",
        "request bytes: one request's body as the clients build it (HTTP: JSON header and "
        "binary tensor; gRPC: the ModelInferRequest message). The response (1,000 FP32 "
        "logits) is the same for both models.",
        "server CPU ms/infer: user + system CPU of the server process over the point, per "
        "inference it counted.",
        *args.note,
    ]
    args.out.write_text(render(header, measured, notes))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
