"""A model whose running time the request chooses, so tests can make requests queue.

``y = x + sum(x) / SIZE`` (a batch holds one request), computed the long way: a SIZE x SIZE
matrix is multiplied by the identity ``iterations`` times in an ONNX Loop (about 10 ms an
iteration on one core), so one request with a large count keeps the only instance busy for
seconds while requests with a count of 1 wait in the queue behind it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 512
WIDTH = 4


def build_model() -> onnx.ModelProto:
    """x FP32 [batch, WIDTH], iterations INT64 [batch, 1] -> y FP32 [batch, WIDTH]."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["m_in", "eye"], ["m_out"]),
        ],
        "times_identity",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_in", TensorProto.FLOAT, [SIZE, SIZE]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_out", TensorProto.FLOAT, [SIZE, SIZE]),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["iterations"], ["trips"], keepdims=0),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=1),
        helper.make_node("Mul", ["eye", "total"], ["m0"]),
        helper.make_node("Loop", ["trips", "true", "m0"], ["m_last"], body=body),
        helper.make_node("ReduceMean", ["m_last"], ["shift"], keepdims=1),  # sum(x) / SIZE
        helper.make_node("Add", ["x", "shift"], ["y"]),
    ]
    constants = [
        numpy_helper.from_array(np.eye(SIZE, dtype=np.float32), "eye"),
        numpy_helper.from_array(np.array(True), "true"),
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("iterations", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def expected(x: np.ndarray) -> np.ndarray:
    """What the model answers for ``x``."""
    return x + x.sum(dtype=np.float32) / np.float32(SIZE)


def write_slow_model(repo: Path, name: str, max_queue_size: int, max_batch_size: int = 1) -> None:
    """``repo/name``: one CPU instance, ``max_batch_size`` samples a batch (one request by
    default: the model's answer mixes its batch's rows), a queue of ``max_queue_size``."""
    (repo / name / "1").mkdir(parents=True)
    onnx.save(build_model(), str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\n'
        f"max_batch_size: {max_batch_size}\n"
        "instance_group [{ kind: KIND_CPU  count: 1 }]\n"
        f"dynamic_batching {{ default_queue_policy {{ max_queue_size: {max_queue_size} }} }}\n"
    )
