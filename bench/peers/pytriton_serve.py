"""PyTriton serving ONNX files with ONNX Runtime, behind Triton's dynamic batcher.

Runs in the peers environment (not the project's): imports only pytriton, numpy, onnxruntime.

    python -m bench.peers.pytriton_serve --model NAME=FILE [...] --http-port N --grpc-port N
        --metrics-port N [--max-batch 64] [--queue-delay-us 1000]

Prints ``READY`` once every model is loaded, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime
from pytriton.decorators import batch  # type: ignore[import-not-found]
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # type: ignore[import-not-found]
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig  # type: ignore[import-not-found]

# ONNX Runtime type names of the numeric tensor types.
NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}  # fmt: skip


def tensors(args: list[Any]) -> list[Tensor]:
    """PyTriton tensors from ORT's node args: the batch axis dropped, free axes as -1."""
    return [
        Tensor(name=a.name, dtype=NUMPY[a.type],
               shape=tuple(d if isinstance(d, int) else -1 for d in a.shape[1:]))
        for a in args
    ]  # fmt: skip


def infer_function(session: onnxruntime.InferenceSession) -> Callable[..., dict[str, Any]]:
    names = [o.name for o in session.get_outputs()]

    def infer(**inputs: Any) -> dict[str, Any]:
        return dict(zip(names, session.run(None, inputs), strict=True))

    batched: Callable[..., dict[str, Any]] = batch(infer)
    return batched


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTriton serving ONNX files")
    parser.add_argument("--model", action="append", required=True, metavar="NAME=FILE")
    for port in ("--http-port", "--grpc-port", "--metrics-port"):
        parser.add_argument(port, type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=1000)
    args = parser.parse_args()
    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port,
                          grpc_address="127.0.0.1", grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, log_verbose=0)  # fmt: skip
    # perf_analyzer reads /stats, which PyTriton >= 0.6 guards with a token; loopback only here.
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, security_config=security) as triton:
        for spec in args.model:
            name, _, path = spec.partition("=")
            session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            batcher = DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us)
            triton.bind(model_name=name, infer_func=infer_function(session),
                        inputs=tensors(session.get_inputs()),
                        outputs=tensors(session.get_outputs()),
                        config=ModelConfig(max_batch_size=args.max_batch, batcher=batcher),
                        strict=False)  # fmt: skip
        stop: list[int] = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        triton.run()
        print("READY", flush=True)
        while not stop:
            signal.pause()


if __name__ == "__main__":
    main()
