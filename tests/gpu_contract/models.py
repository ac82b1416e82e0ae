"""A tiny ONNX model every provider accepts, and its numpy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
CONFIG = """
name: "mlp"
max_batch_size: 8
input [{ name: "x" data_type: TYPE_FP32 dims: [8] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]
"""


def write_mlp(path: Path) -> Path:
    """x[batch, 8] FP32 -> y = x @ WEIGHTS, in ``<path>`` (a model directory's version file)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def reference(x: np.ndarray) -> np.ndarray:
    return x @ WEIGHTS
