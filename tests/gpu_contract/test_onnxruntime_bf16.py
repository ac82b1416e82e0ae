"""BF16 ONNX models through onnxruntime-gpu's own Python package (the one a GPU host runs):
the binding calls batchserve makes for them (ONNX's element type in ``bind_input``, a
bfloat16 ``OrtValue`` over uint16 memory, its bytes read back by ``data_ptr``) exist there
and carry the bits exactly, on its CPU provider, as the CUDA one cannot start over stubs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx import TensorProto, helper

# 1.5, -0.1, +inf, -0.0 and a NaN with payload bits, as bfloat16 bits
BITS = np.array([0x3FC0, 0xBDCD, 0x7F80, 0x8000, 0x7FC1], dtype=np.uint16)


def _identity(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["N", len(BITS)])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["N", len(BITS)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("io_binding", [None, True], ids=["per batch", "fixed buffers"])
def test_bf16_bits_round_trip_through_the_gpu_package(
    tmp_path: Path, io_binding: bool | None
) -> None:
    backend = OnnxBackend(io_binding=io_binding)
    backend.load(_identity(tmp_path / "bf16.onnx"), ModelConfig(name="m", max_batch_size=4), CPU)
    try:
        x = np.tile(BITS, (3, 1))
        y = backend.infer({"x": x})["y"]
        assert y.dtype == np.uint16
        np.testing.assert_array_equal(y, x)
    finally:
        backend.unload()
