"""A run ONNX Runtime is in the middle of ends when another thread stops it (its clients all
went away), through either way of running; the next run is not stopped by it."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.onnx_options import CUDA_EP
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BackendError
from batchserve.devices.placement import gpu_count
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx import helper, numpy_helper
from onnx_models import FP32, build_model, write_model

WIDTH, NODES, ROWS = 256, 400, 512
HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()


def _chain(path: Path) -> Path:
    """``NODES`` multiplications by the identity, one after another: a run of many nodes,
    each short (ORT looks at the stop between two)."""
    eye = numpy_helper.from_array(np.eye(WIDTH, dtype=np.float32), "eye")
    names = ["x", *(f"h{n}" for n in range(NODES - 1)), "y"]
    nodes = [helper.make_node("MatMul", [a, "eye"], [b]) for a, b in itertools.pairwise(names)]
    model = build_model([("x", FP32, ("N", WIDTH))], [], initializers=[eye], nodes=nodes)
    model.graph.output.append(helper.make_tensor_value_info("y", FP32, ["N", WIDTH]))
    return write_model(path, model)


@pytest.mark.parametrize(
    ("device", "io_binding"),
    [
        (CPU, False),
        (CPU, True),
        pytest.param(
            Device("gpu", 0),
            True,
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu"),
                pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU"),
            ],
        ),
    ],
    ids=["cpu", "cpu-io-binding", "gpu"],
)
def test_a_run_stopped_from_another_thread_ends_and_the_next_runs_whole(
    tmp_path: Path, device: Device, io_binding: bool
) -> None:
    backend = OnnxBackend(io_binding=io_binding)
    backend.load(_chain(tmp_path / "chain.onnx"), ModelConfig(name="chain"), device)
    assert backend.device == device
    x = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)
    backend.infer({"x": x})  # warm
    started = time.perf_counter()
    backend.infer({"x": x})
    whole = time.perf_counter() - started
    stop = threading.Timer(whole / 10, backend.interrupt)
    stop.start()
    started = time.perf_counter()
    with pytest.raises(BackendError, match="terminate"):
        backend.infer({"x": x})
    stopped = time.perf_counter() - started
    stop.join()
    assert stopped < whole / 2, (stopped, whole)
    np.testing.assert_array_equal(backend.infer({"x": x})["y"], x)  # not stopped in turn


def test_a_stop_while_nothing_runs_ends_nothing(tmp_path: Path) -> None:
    backend = OnnxBackend()
    backend.load(_chain(tmp_path / "chain.onnx"), ModelConfig(name="chain"), CPU)
    backend.interrupt()
    x = np.ones((2, WIDTH), np.float32)
    np.testing.assert_array_equal(backend.infer({"x": x})["y"], x)
