"""Tiny real ONNX files for tests, built with onnx.helper (no torch needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

Dim = int | str | None  # a fixed size, a named free axis, or an unnamed free axis
Tensor = tuple[str, int, Sequence[Dim]]  # name, onnx.TensorProto element type, shape

FP32 = TensorProto.FLOAT
INT64 = TensorProto.INT64

IMAGE: Tensor = ("image", FP32, ("N", 1, 8, 8))
LOGITS: Tensor = ("logits", FP32, ("N", 10))


def _value_info(tensor: Tensor) -> onnx.ValueInfoProto:
    name, elem_type, shape = tensor
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def build_model(
    inputs: Sequence[Tensor] = (IMAGE,),
    outputs: Sequence[Tensor] = (LOGITS,),
    *,
    initializers: Sequence[TensorProto] = (),
    nodes: Sequence[onnx.NodeProto] = (),
) -> onnx.ModelProto:
    """A graph onnx.checker accepts; output j copies input j (or the first): only the declared
    signature matters to the code under test."""
    identities = [
        helper.make_node("Identity", [inputs[min(j, len(inputs) - 1)][0]], [out[0]])
        for j, out in enumerate(outputs)
    ]
    graph = helper.make_graph(
        [*nodes, *identities],
        "test",
        [_value_info(t) for t in inputs],
        [_value_info(t) for t in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # loadable by the onnxruntime release installed with the project
    return model


def write_model(path: Path, model: onnx.ModelProto | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model if model is not None else build_model(), str(path))
    return path


def external_tensor(name: str, location: str) -> TensorProto:
    """A float tensor whose data lives in an external file at ``location``."""
    tensor = helper.make_tensor(name, FP32, [2], [0.0, 0.0])
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def with_external_initializer(location: str) -> onnx.ModelProto:
    return build_model(initializers=[external_tensor("weight", location)])


def with_external_in_subgraph(location: str) -> onnx.ModelProto:
    """An If node whose then-branch holds a Constant with external data."""

    def branch(value: TensorProto) -> onnx.GraphProto:
        constant = helper.make_node("Constant", [], ["branch_out"], value=value)
        out = helper.make_tensor_value_info("branch_out", FP32, [2])
        return helper.make_graph([constant], "branch", [], [out])

    inline = helper.make_tensor("inline", FP32, [2], [0.0, 0.0])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    node = helper.make_node(
        "If",
        ["cond"],
        ["unused"],
        then_branch=branch(external_tensor("deep", location)),
        else_branch=branch(inline),
    )
    return build_model(initializers=[cond], nodes=[node])
