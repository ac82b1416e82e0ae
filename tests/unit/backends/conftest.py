"""Small ONNX graphs built with onnx.helper, saved to tmp_path, with their numpy reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx import TensorProto, helper, numpy_helper

Dim = int | str


def save_model(
    path: Path,
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[Dim]]],
    outputs: Sequence[tuple[str, int, Sequence[Dim]]],
    weights: dict[str, np.ndarray] | None = None,
    domains: Sequence[str] = (),
) -> Path:
    graph = helper.make_graph(
        list(nodes),
        path.stem,
        [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in (weights or {}).items()],
    )
    opsets = [helper.make_opsetid(domain, 1) for domain in domains]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *opsets])
    model.ir_version = 9  # what the installed onnxruntime reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def build_onnx() -> Callable[..., Path]:
    """``save_model`` for tests that need a graph of their own."""
    return save_model


RNG = np.random.default_rng(0)
MLP_W = RNG.standard_normal((8, 4)).astype(np.float32)
MLP_B = RNG.standard_normal(4).astype(np.float32)


def _mlp(x: np.ndarray) -> dict[str, np.ndarray]:
    hidden = x @ MLP_W + MLP_B
    return {"y": np.maximum(hidden, 0), "hidden": hidden}


@pytest.fixture
def mlp_reference() -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """What the mlp model computes, in numpy."""
    return _mlp


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    """x[batch, 8] FP32 -> hidden = x @ W + b, y = relu(hidden): two outputs."""
    return save_model(
        tmp_path / "mlp.onnx",
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["hidden"]),
            helper.make_node("Relu", ["hidden"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, ["batch", 8])],
        [("y", TensorProto.FLOAT, ["batch", 4]), ("hidden", TensorProto.FLOAT, ["batch", 4])],
        {"w": MLP_W, "b": MLP_B},
    )


@pytest.fixture
def int64_file(tmp_path: Path) -> Path:
    """ids[batch, 3] INT64 -> out = ids * 3 + 7."""
    return save_model(
        tmp_path / "int64.onnx",
        [
            helper.make_node("Mul", ["ids", "three"], ["tripled"]),
            helper.make_node("Add", ["tripled", "seven"], ["out"]),
        ],
        [("ids", TensorProto.INT64, ["batch", 3])],
        [("out", TensorProto.INT64, ["batch", 3])],
        {"three": np.array(3, np.int64), "seven": np.array(7, np.int64)},
    )


@pytest.fixture
def sequence_file(tmp_path: Path) -> Path:
    """tokens[batch, seq, 4] FP32 -> pooled[batch, 4] = sum over the sequence axis."""
    return save_model(
        tmp_path / "sequence.onnx",
        [helper.make_node("ReduceSum", ["tokens", "axes"], ["pooled"], keepdims=0)],
        [("tokens", TensorProto.FLOAT, ["batch", "seq", 4])],
        [("pooled", TensorProto.FLOAT, ["batch", 4])],
        {"axes": np.array([1], np.int64)},
    )


@pytest.fixture
def fp16_file(tmp_path: Path) -> Path:
    """x[batch, 4] FP16 -> y = x * 0.5 + 1 in half precision."""
    return save_model(
        tmp_path / "fp16.onnx",
        [
            helper.make_node("Mul", ["x", "half"], ["scaled"]),
            helper.make_node("Add", ["scaled", "one"], ["y"]),
        ],
        [("x", TensorProto.FLOAT16, ["batch", 4])],
        [("y", TensorProto.FLOAT16, ["batch", 4])],
        {"half": np.array(0.5, np.float16), "one": np.array(1.0, np.float16)},
    )


WIDE_W = np.full((64, 1024), 0.01, np.float32)


@pytest.fixture
def wide_file(tmp_path: Path) -> Path:
    """x[batch, 64] -> y[batch, 1024]: 256 KiB of weights, 4 KiB of output per sample."""
    return save_model(
        tmp_path / "wide.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 64])],
        [("y", TensorProto.FLOAT, ["batch", 1024])],
        {"w": WIDE_W},
    )


@pytest.fixture
def config() -> ModelConfig:
    return ModelConfig(name="m")
