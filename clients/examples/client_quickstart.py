"""batchserve_client in a few lines: HTTP and gRPC, blocking and asyncio.

    pip install -e clients/python
    python clients/examples/client_quickstart.py [HTTP_HOST:PORT [GRPC_HOST:PORT]]

The addresses come from the arguments, else $BATCHSERVE_HTTP and $BATCHSERVE_GRPC, else
localhost:8000 and localhost:8001.
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
from batchserve_client import AsyncClient, Client, InferResult, NotFound

# One 8x8 image of a handwritten 0, pixel values 0-16 (scikit-learn's digits, image 0).
IMAGE = np.array(
    [[0, 0, 5, 13, 9, 1, 0, 0], [0, 0, 13, 15, 10, 15, 5, 0],
     [0, 3, 15, 2, 0, 11, 8, 0], [0, 4, 12, 0, 0, 8, 8, 0],
     [0, 5, 8, 0, 0, 9, 8, 0], [0, 4, 11, 0, 1, 12, 7, 0],
     [0, 2, 14, 5, 10, 12, 0, 0], [0, 0, 6, 13, 10, 0, 0, 0]],
    dtype=np.float32,
).reshape(1, 1, 8, 8)  # fmt: skip


def report(url: str, mode: str, result: InferResult) -> None:
    probabilities = result["probabilities"][0]
    digit = int(probabilities.argmax())
    print(f"{url} {mode}: digit {digit} (probability {probabilities[digit]:.4f})")


def blocking(url: str) -> None:
    """One client per server: it keeps its connection open between calls."""
    with Client(url, timeout=10.0) as client:
        inputs = client.model_metadata("digits_cnn").inputs
        print(f"{url} ready: {client.is_ready()}")
        print(f"{url} digits_cnn takes {[(t.name, t.datatype, t.shape) for t in inputs]}")
        result = client.infer("digits_cnn", {"image": IMAGE}, outputs=["probabilities"])
        report(url, "sync", result)
        try:
            client.infer("no_such_model", {"image": IMAGE})
        except NotFound as error:  # every error is a BatchserveClientError
            print(f"{url} not found: {error}")


async def concurrent(url: str) -> None:
    """Calls of one asyncio client run concurrently; the server batches them together."""
    async with AsyncClient(url, timeout=10.0) as client:
        calls = [client.infer("digits_cnn", {"image": IMAGE}, request_id=str(i)) for i in range(4)]
        results = await asyncio.gather(*calls)
        print(f"{url} async: answers to requests {[result.id for result in results]}")
        report(url, "async", results[0])


def main() -> None:
    args = sys.argv[1:]
    http = args[0] if args else os.environ.get("BATCHSERVE_HTTP", "localhost:8000")
    grpc = args[1] if len(args) > 1 else os.environ.get("BATCHSERVE_GRPC", "localhost:8001")
    for url in (f"http://{http}", f"grpc://{grpc}"):
        blocking(url)
        asyncio.run(concurrent(url))


if __name__ == "__main__":
    main()
