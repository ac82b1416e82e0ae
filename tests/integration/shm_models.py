"""The two models NVIDIA's shared-memory examples call, as small ONNX graphs.

``simple``: INT32 INPUT0, INPUT1 [16] -> OUTPUT0 = sum, OUTPUT1 = difference.
``simple_string``: the same over BYTES tensors holding decimal integers (ONNX ``Cast``
parses and prints them), as Triton's ``simple_string`` model does. A "0" is put in front of
each string before parsing, so the server's warm-up (empty strings) reads as zeros.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input {{ name: "INPUT0" data_type: {dtype} dims: [16] }}
input {{ name: "INPUT1" data_type: {dtype} dims: [16] }}
output {{ name: "OUTPUT0" data_type: {dtype} dims: [16] }}
output {{ name: "OUTPUT1" data_type: {dtype} dims: [16] }}
"""


def _graph(elem: int) -> onnx.ModelProto:
    io = [
        helper.make_tensor_value_info(name, elem, ["N", 16])
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    nodes = []
    a, b = "INPUT0", "INPUT1"
    if elem == TensorProto.STRING:
        zero = helper.make_tensor("zero", TensorProto.STRING, [], [b"0"])
        nodes += [
            helper.make_node("Constant", [], ["zero"], value=zero),
            helper.make_node("StringConcat", ["zero", "INPUT0"], ["a0"]),
            helper.make_node("StringConcat", ["zero", "INPUT1"], ["b0"]),
            helper.make_node("Cast", ["a0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["b0"], ["b"], to=TensorProto.INT32),
        ]
        a, b = "a", "b"
    sums = ["sum", "diff"] if elem == TensorProto.STRING else ["OUTPUT0", "OUTPUT1"]
    nodes += [
        helper.make_node("Add", [a, b], [sums[0]]),
        helper.make_node("Sub", [a, b], [sums[1]]),
    ]
    if elem == TensorProto.STRING:
        nodes += [
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    graph = helper.make_graph(nodes, "simple", io[:2], io[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def write_simple_models(repo: Path) -> Path:
    """``simple`` and ``simple_string`` under ``repo``; returns ``repo``."""
    for name, elem, dtype in (
        ("simple", TensorProto.INT32, "TYPE_INT32"),
        ("simple_string", TensorProto.STRING, "TYPE_STRING"),
    ):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(_graph(elem), str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, dtype=dtype))
    return repo
