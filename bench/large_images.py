"""Large images: the server's memory and time with batches bounded in pixels, and without.

    python -m bench.large_images [--rounds 3] [--concurrency 32] [--out bench/LARGE_IMAGES.md]

The ResNet-like CNN (``bench.models:resnet18ish``) is exported with the real ``batchserve
export`` with free height and width (``--input image:FP32:batch,3,h,w``). As exported, its
memory is reserved for 64 images of the probe's 128 x 128 pixels, and batches hold no more
pixels than that; a copy with ``batchserve { max_batch_steps: N }`` reserves for 64 images of
the workload's largest, which lets the same requests batch as they did before batches were
bounded in pixels. Each round starts a server on one of the two (they take turns), sends the
same seeded images (sizes mixed: 1 x 1024 x 1024, 2 x 512 x 512, 4 x 256 x 256) from
``--concurrency`` clients over HTTP (binary tensors), and reads the server's resident memory
once loaded and its high-water mark (``VmHWM``) after the requests, with the time they took.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from bench.memory_rounds import Round, arguments, report, serve_round, taking_turns
from bench.repo import RESNET, export

MODEL = "resnet_free"
FREE_IMAGE = ("--input", "image:FP32:batch,3,h,w")
SHAPES = ((1, 1024), (2, 512), (4, 256))
"""(images, side) of each group of requests, in the order they are sent."""
GROUPS = 8
RAISED_PIXELS = 64 * 1024 * 1024
"""64 images of the workload's largest: room for its batches as they formed before the bound."""


def requests(seed: int = 0) -> list[np.ndarray]:
    """Every request's images, seeded."""
    rng = np.random.default_rng(seed)
    return [rng.random((rows, 3, side, side), dtype=np.float32)
            for _ in range(GROUPS) for rows, side in SHAPES]  # fmt: skip


def raised_copy(exported: Path, repo: Path, pixels: int) -> None:
    """The exported model with ``max_batch_steps`` set, or as exported when ``pixels`` is 0."""
    shutil.copytree(exported, repo / MODEL)
    if pixels:
        config = repo / MODEL / "config.pbtxt"
        config.write_text(config.read_text() + f"batchserve {{ max_batch_steps: {pixels} }}\n")


async def send_all(url: str, sent: list[np.ndarray], concurrency: int) -> None:
    """Every request over HTTP as binary tensors, at most ``concurrency`` at a time; any
    failure ends the bench. (HTTP: tritonclient's gRPC protos clash with the server's own,
    which exporting imports into this process.)"""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)

    async with httpx.AsyncClient(base_url=f"http://{url}", timeout=600, limits=limits) as client:

        async def one(images: np.ndarray) -> None:
            header = json.dumps({"inputs": [{
                "name": "image", "datatype": "FP32", "shape": list(images.shape),
                "parameters": {"binary_data_size": images.nbytes},
            }]}).encode()  # fmt: skip
            async with gate:
                answer = await client.post(
                    f"/v2/models/{MODEL}/infer",
                    content=header + images.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(header))},
                )
            if answer.status_code != 200:
                raise SystemExit(f"HTTP {answer.status_code}: {answer.text[:300]}")
            if answer.json()["outputs"][0]["shape"][0] != images.shape[0]:
                raise SystemExit("an answer of the wrong shape")

        await asyncio.gather(*(one(images) for images in sent))


def one_round(setting: str, exported: Path, concurrency: int, work: Path) -> Round:
    repo = work / f"repo-{setting}"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir()
    raised_copy(exported, repo, 0 if setting == "bounded" else RAISED_PIXELS)
    sent = requests()
    return serve_round(
        setting, repo, lambda url: asyncio.run(send_all(url, sent, concurrency)), port="http_port"
    )


def render(rounds: list[Round], concurrency: int) -> str:
    count = GROUPS * len(SHAPES)
    shapes = ", ".join(f"{rows} x {side} x {side}" for rows, side in SHAPES)
    title = "Large images: batches bounded in pixels (ResNet-like CNN, free height and width)"
    return report(title, [
        f"{count} requests over HTTP (binary tensors) from {concurrency} clients, {GROUPS} of "
        f"each of {shapes} (images x pixels), seeded; one server (one process) per round, the "
        "two settings taking turns",
        f"`{RESNET}` exported with `batchserve export ... --input image:FP32:batch,3,h,w`; "
        "bounded: as exported, 64 x 128 x 128 pixels a batch (64 rows of the memory probe's); "
        f"raised: `max_batch_steps: {RAISED_PIXELS}`, which lets these requests batch as they "
        "did before batches were bounded in pixels",
    ], rounds)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m bench.large_images", "LARGE_IMAGES.md", argv)
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        print(f"exporting {RESNET} with free height and width", flush=True)
        exported = export(Path(work), f"bench.models:{RESNET}", MODEL, FREE_IMAGE)
        for setting in taking_turns(args.rounds):
            rounds.append(one_round(setting, exported, args.concurrency, Path(work)))
            print(rounds[-1], flush=True)
    text = render(rounds, args.concurrency)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
