"""Text generation with step-level batching: characters per second and time to first
character at 1, 8, 32 and 128 concurrent generations, against one generation at a time.

    python -m bench.generation [--levels 1,8,32,128] [--seconds 8] [--tokens 64]
                               [--out bench/GENERATION.md]

One server (one process) serves model_repo/. Each of N clients runs generations back to
back over its own gRPC ModelStreamInfer call (char_lstm_generate: a prompt of 8 to 24
characters from the corpus, 64 characters at temperature 0.8, its own seed), as a stream
of one response per character. Characters are counted when they arrive within the
measurement window; time to first character is from sending the request to its first
response, for generations started in the window. The step model's statistics give the mean
rows per step. N = 1 is "each generation alone": the ratio column is the aggregate rate over
that.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pb_grpc

from bench import machine
from bench.common import ROOT, model_stats, start_server, stop_server

MODEL, STEP_MODEL = "char_lstm_generate", "char_lstm_step"
WARM_UP_S = 1.0
PROMPTS = (
    "def __init__(self",
    "import ",
    "    return self.",
    "class Fraction(",
    "for i in range(",
    "if not isinstance(",
    "    raise ValueError(",
    "from . import ",
)


@dataclass
class Level:
    clients: int
    characters: int = 0
    seconds: float = 0.0
    first_ms: list[float] = field(default_factory=list)
    generations: int = 0
    rows_per_step: float = 0.0

    @property
    def rate(self) -> float:
        return self.characters / self.seconds


def _request(prompt: str, tokens: int, seed: int) -> pb.ModelInferRequest:
    text = prompt.encode()
    request = pb.ModelInferRequest(model_name=MODEL, id=str(seed))
    for name, datatype in (("text_input", "BYTES"), ("max_tokens", "INT32"),
                           ("temperature", "FP32"), ("random_seed", "UINT64")):  # fmt: skip
        request.inputs.add(name=name, datatype=datatype, shape=[1])
    request.raw_input_contents.extend([
        struct.pack("<I", len(text)) + text,
        np.array([tokens], np.int32).tobytes(),
        np.array([0.8], np.float32).tobytes(),
        np.array([seed], np.uint64).tobytes(),
    ])  # fmt: skip
    return request


async def _client(
    stub: Any, index: int, tokens: int, window: tuple[float, float], level: Level
) -> None:
    """``stub``: the service's stub on a grpc.aio channel (typed for the sync one)."""
    start, end = window
    seed = index * 1_000_000
    while time.monotonic() < end:
        seed += 1
        prompt = PROMPTS[seed % len(PROMPTS)]
        sent = time.monotonic()
        call = stub.ModelStreamInfer(iter([_request(prompt, tokens, seed)]))
        first = True
        async for answer in call:
            if answer.error_message:
                raise SystemExit(f"generation failed: {answer.error_message}")
            now = time.monotonic()
            if first and start <= sent < end:
                level.first_ms.append((now - sent) * 1000)
                level.generations += 1
            first = False
            if start <= now < end:
                level.characters += 1
            if answer.infer_response.parameters["triton_final_response"].bool_param:
                break
        call.cancel()


async def _level(grpc_port: int, http_port: int, clients: int, seconds: float,
                 tokens: int) -> Level:  # fmt: skip
    level = Level(clients)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        begin = time.monotonic()
        window = (begin + WARM_UP_S, begin + WARM_UP_S + seconds)
        await asyncio.sleep(0)
        before = model_stats(http_port, STEP_MODEL)
        tasks = [_client(stub, i, tokens, window, level) for i in range(clients)]
        await asyncio.gather(*tasks)
        after = model_stats(http_port, STEP_MODEL)
    level.seconds = seconds
    rows = int(after["inference_count"]) - int(before["inference_count"])
    steps = int(after["execution_count"]) - int(before["execution_count"])
    level.rows_per_step = rows / max(1, steps)
    return level


def measure(levels: list[int], seconds: float, tokens: int) -> list[Level]:
    with tempfile.TemporaryDirectory(prefix="bench-generation-"):
        process, ports = start_server(ROOT / "model_repo", ("--log-format", "json"))
        try:
            results = []
            for clients in levels:
                level = asyncio.run(_level(ports["grpc_port"], ports["http_port"], clients,
                                           seconds, tokens))  # fmt: skip
                results.append(level)
                print(f"N={clients}: {level.rate:,.0f} chars/s, TTFC p50 "
                      f"{statistics.median(level.first_ms):.1f} ms, "
                      f"{level.rows_per_step:.1f} rows/step", flush=True)  # fmt: skip
        finally:
            stop_server(process)
    return results


def render(results: list[Level], seconds: float, tokens: int) -> str:
    alone = next((r for r in results if r.clients == 1), results[0])
    lines = ["# Generation with step-level batching (char_lstm_generate over char_lstm_step)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    lines += [
        f"- one server process; N clients each run generations back to back, {tokens} "
        f"characters at temperature 0.8 after a prompt of 8 to 24 characters, each over its "
        f"own gRPC stream (one response per character); {seconds:.0f} s windows after "
        f"{WARM_UP_S:.0f} s of warm-up; clients and server share the machine",
        "- N = 1 is each generation alone; rows per step: char_lstm_step's inference count "
        "over its execution count in the window (the generations sharing one step)",
        "",
        "| generations | chars/s (all) | vs alone | chars/s each | first char p50 (ms) | "
        "first char p99 (ms) | rows per step |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p99 = float(np.percentile(r.first_ms, 99))
        lines.append(
            f"| {r.clients} | {r.rate:,.0f} | {r.rate / alone.rate:.1f} | "
            f"{r.rate / r.clients:,.0f} | {statistics.median(r.first_ms):.1f} | {p99:.1f} | "
            f"{r.rows_per_step:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "GENERATION.md")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    results = measure(levels, args.seconds, args.tokens)
    args.out.write_text(render(results, args.seconds, args.tokens))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
