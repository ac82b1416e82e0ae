"""Long sequences: the server's memory and time with batches bounded in steps, and without.

    python -m bench.long_sequences [--rounds 3] [--concurrency 32] [--out bench/LONG_SEQUENCES.md]

char_lstm as shipped reserves memory for 64 rows of 128 steps (8,192), and batches within
them; a copy with ``batchserve { max_batch_steps: 524288 }`` reserves for 64 rows of 8,192,
which lets the same requests batch as they did before batches were bounded in steps. Each
round starts a server on one of the two (they take turns), sends the same seeded requests
(rows and lengths mixed: 1 x 8,000, 2 x 3,000, 8 x 500 and 1 x 100 tokens) from
``--concurrency`` clients over gRPC, and reads the server's resident memory once loaded and
its high-water mark (``VmHWM``) after the requests, with the time they took.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from batchserve.zoo.char_lstm import PAD, VOCAB_SIZE

from bench.common import ROOT
from bench.memory_rounds import Round, arguments, report, serve_round, taking_turns

MODEL = "char_lstm"
RAISED_STEPS = 524_288
"""64 rows of 8,192 steps: room for the workload's batches as they formed before the bound."""
SHAPES = ((1, 8000), (2, 3000), (8, 500), (1, 100))
"""(rows, tokens) of each group of requests, in the order they are sent."""
GROUPS = 40


def requests(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, lengths) of every request, seeded; lengths as sent (no padding within)."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(GROUPS):
        for rows, length in SHAPES:
            tokens = rng.integers(0, VOCAB_SIZE, (rows, length))
            tokens[tokens == PAD] = PAD + 1
            made.append((tokens.astype(np.int64), np.full((rows, 1), length, np.int64)))
    return made


def raised_copy(repo: Path, steps: int) -> None:
    """char_lstm with ``max_batch_steps`` set, or as shipped when ``steps`` is 0."""
    shutil.copytree(ROOT / "model_repo" / MODEL, repo / MODEL)
    if steps:
        config = repo / MODEL / "config.pbtxt"
        text = config.read_text()
        if "batchserve {" not in text:
            raise SystemExit(f"{MODEL}'s config has no batchserve block to extend")
        config.write_text(
            text.replace("batchserve {", f"batchserve {{\n  max_batch_steps: {steps}")
        )


async def send_all(url: str, sent: list[tuple[np.ndarray, np.ndarray]], concurrency: int) -> None:
    """Every request, at most ``concurrency`` at a time; any failure ends the bench.
    tritonclient's gRPC protos clash with the server's own in one process: imported here."""
    import tritonclient.grpc.aio as grpcclient  # type: ignore[import-untyped]

    client = grpcclient.InferenceServerClient(url)
    gate = asyncio.Semaphore(concurrency)

    async def one(tokens: np.ndarray, lengths: np.ndarray) -> None:
        inputs = [grpcclient.InferInput("tokens", list(tokens.shape), "INT64"),
                  grpcclient.InferInput("lengths", list(lengths.shape), "INT64")]  # fmt: skip
        inputs[0].set_data_from_numpy(tokens)
        inputs[1].set_data_from_numpy(lengths)
        async with gate:
            result = await client.infer(MODEL, inputs, client_timeout=600)
        if result.as_numpy("next_char_logits").shape != (tokens.shape[0], VOCAB_SIZE):
            raise SystemExit("an answer of the wrong shape")

    try:
        await asyncio.gather(*(one(tokens, lengths) for tokens, lengths in sent))
    finally:
        await client.close()


def one_round(setting: str, steps: int, concurrency: int, work: Path) -> Round:
    repo = work / f"repo-{setting}"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir()
    raised_copy(repo, steps)
    sent = requests()
    return serve_round(setting, repo, lambda url: asyncio.run(send_all(url, sent, concurrency)))


def render(rounds: list[Round], concurrency: int) -> str:
    count = GROUPS * len(SHAPES)
    shapes = ", ".join(f"{rows} x {length:,}" for rows, length in SHAPES)
    return report("Long sequences: batches bounded in steps (char_lstm)", [
        f"{count} requests over gRPC from {concurrency} clients, {GROUPS} of each of {shapes} "
        "(rows x tokens), seeded; one server (one process) per round, the two settings "
        "taking turns",
        "bounded: char_lstm as shipped, 8,192 steps a batch (64 rows of the memory probe's "
        f"128); raised: `max_batch_steps: {RAISED_STEPS}`, which lets these requests batch "
        "as they did before batches were bounded in steps",
    ], rounds)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m bench.long_sequences", "LONG_SEQUENCES.md", argv)
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        for setting in taking_turns(args.rounds):
            steps = 0 if setting == "bounded" else RAISED_STEPS
            rounds.append(one_round(setting, steps, args.concurrency, Path(work)))
            print(rounds[-1], flush=True)
    text = render(rounds, args.concurrency)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
