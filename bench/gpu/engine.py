"""The in-process engine: each exported model loaded through batchserve's own backend.

The ceiling a served model is judged against is the same file, on the same backend code
(I/O binding, pinned buffers, the TensorRT profiles), called in this process with no
server, queue or wire in between: throughput and time per batch at batch 1, 2, 4, ... max.
The same loaded backend answers the fixed accuracy batch first.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from batchserve.backends.base import Backend
from batchserve.backends.selection import create_backend
from batchserve.core.device import Device
from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig

from bench.ceiling import time_calls
from bench.gpu import accuracy, networks
from bench.gpu.records import Accuracy, EnginePoint, Key
from bench.gpu.runtimes import RuntimeSpec
from bench.inputs import plan

ACCURACY_BATCH = 8
VERSION = "1"


class _Calls:
    """ONNX Runtime's ``run(names, feeds)`` over a backend, for ``bench.ceiling.time_calls``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, Any]) -> Any:
        return self.backend.infer(feeds, names)


def model_file(model_dir: Path, spec: RuntimeSpec) -> Path:
    return model_dir / VERSION / spec.filename


def config_of(model_dir: Path) -> ModelConfig:
    return load_pbtxt(model_dir / CONFIG_FILENAME)


@contextmanager
def loaded(model_dir: Path, spec: RuntimeSpec) -> Iterator[Backend]:
    """The model on its runtime's device, unloaded (and PyTorch's cache emptied) after."""
    config, path = config_of(model_dir), model_file(model_dir, spec)
    backend = create_backend(config, path)
    backend.load(path, config, Device(spec.device, 0))
    try:
        yield backend
    finally:
        backend.unload()
        _empty_torch_cache()


def _empty_torch_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure(
    key: Key, model_dir: Path, spec: RuntimeSpec, batches: Sequence[int], budget_s: float,
    image_size: int,
) -> tuple[list[Accuracy], list[EnginePoint]]:  # fmt: skip
    """The accuracy figures, then one ceiling point per batch size."""
    config = config_of(model_dir)
    with loaded(model_dir, spec) as backend:
        found = check(key, backend, config, image_size)
        return found, ceilings(key, backend, config, batches, budget_s)


def check(key: Key, backend: Backend, config: ModelConfig, image_size: int) -> list[Accuracy]:
    from bench.gpu import models  # torch: here, so that the rest runs without it

    batch = networks.fixed_batch(key.model, ACCURACY_BATCH, image_size)
    names = [tensor.name for tensor in config.output]
    got = backend.infer({config.input[0].name: batch}, names)
    return accuracy.compare(key, names, got, models.reference(key.model, batch))


def ceilings(
    key: Key, backend: Backend, config: ModelConfig, batches: Sequence[int], budget_s: float
) -> list[EnginePoint]:
    inputs = plan(config.name, config, {})
    calls, points = _Calls(backend), []
    for batch in batches:
        feeds = {name: np.ascontiguousarray(a) for name, a in inputs.feeds(batch).items()}
        times = time_calls(calls, feeds, budget_s)
        points.append(EnginePoint(key, batch, statistics.median(times), len(times)))
    return points
