"""Images sent as bytes: request size and throughput of resnet18ish taking FP32 NCHW floats or
UINT8 NHWC bytes (cast, layout and normalisation baked into the graph), over HTTP and gRPC.

Exports ``bench.models:resnet18ish`` twice through the real ``batchserve export`` (FP32, and
UINT8 with ``--normalize``), serves both from one batchserve, and measures each with
perf_analyzer (batch 1 per request, binary tensors, its random data), the models taking
turns at each point. Writes bench/IMAGE_BYTES.md.

    python -m bench.image_bytes [--concurrency 1,4] [--window-ms 3000] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from batchserve.proto import grpc_service_pb2 as pb

from bench import machine, perf, procstat, repo, servers
from bench.common import ROOT
from bench.records import BATCHSERVE, ServerPoint

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
    variant: Variant
    request_bytes: int
    point: ServerPoint


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
    """The results file: machine, one row per point, and the UINT8/FP32 ratios."""
    lines = ["# Images sent as bytes: FP32 vs UINT8 input", "", *(f"- {h}" for h in header), ""]
    lines += [
        "| model | input (one image) | protocol | request bytes | concurrency | infer/s "
        "| p50 ms | p99 ms | server CPU ms/infer | load1 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in measured:
        row, p = m.point.row, m.point
        shape = "x".join(map(str, m.variant.shape[1:]))
        figures = (
            f"{row.throughput:.1f} | {row.p50_us / 1000:.1f} | {row.p99_us / 1000:.1f}"
            if row
            else f"failed: {p.error[-80:]!r} | | "
        )
        lines.append(
            f"| {m.variant.model} | {m.variant.datatype} {shape} | {p.protocol} | "
            f"{m.request_bytes:,} | {p.concurrency} | {figures} | "
            f"{p.cpu_us_per_request / 1000:.1f} | {p.load1:.2f} |"
        )
    lines += ["", *ratios(measured), "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def ratios(measured: Sequence[Measured]) -> list[str]:
    """UINT8 over FP32 for request bytes and throughput, per protocol and concurrency."""
    by_key = {(m.variant.datatype, m.point.protocol, m.point.concurrency): m for m in measured}
    lines = ["| protocol | concurrency | request bytes UINT8/FP32 | throughput UINT8/FP32 |"]
    lines.append("|---|---:|---:|---:|")
    for (datatype, protocol, concurrency), fp32 in by_key.items():
        uint8 = by_key.get(("UINT8", protocol, concurrency))
        if datatype != "FP32" or uint8 is None:
            continue  # each FP32 point with the UINT8 point beside it
        size = uint8.request_bytes / fp32.request_bytes
        speed = uint8.point.throughput / fp32.point.throughput
        speed_text = f"{speed:.2f}" if math.isfinite(speed) else "n/a"
        lines.append(f"| {protocol} | {concurrency} | {size:.3f} | {speed_text} |")
    return lines


def measure_all(
    repository: Path, concurrencies: Sequence[int], settings: perf.PaSettings, work: Path
) -> list[Measured]:
    """Both models from one server; at each point the two take turns, FP32 first."""
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--model-repository",
               str(repository), "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    measured = []
    try:
        ports = servers.startup(process, " and ".join(v.model for v in VARIANTS))
        running = servers.Running(BATCHSERVE, process, ports)
        for concurrency in concurrencies:
            for protocol in PROTOCOLS:
                for variant in VARIANTS:
                    point = servers.measure(
                        running, variant.model, protocol, concurrency, "on", settings, work
                    )
                    size = REQUEST_BYTES[protocol](variant)
                    measured.append(Measured(variant, size, point))
                    print(
                        f"{variant.model} {protocol} c={concurrency}: "
                        f"{point.throughput:.1f}/s, {size:,} bytes per request",
                        flush=True,
                    )
    finally:
        servers.stop(process)
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image_bytes", description=__doc__)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated")
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--max-trials", type=int, default=4)
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
        measured = measure_all(repository, concurrencies, settings, Path(tmp))
    notes = [
        f"Command: `python -m bench.image_bytes --concurrency {args.concurrency} "
        f"--window-ms {args.window_ms} --max-trials {args.max_trials}`.",
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
