"""Small sequence models with the contract of Triton's example sequence models, so that
NVIDIA's sequence client examples run against batchserve.

``simple_sequence``: INT32 ``INPUT`` [1] -> ``OUTPUT`` [1] = INPUT + START, the START
control filled by the sequence batcher (what Triton's example ``simple_sequence`` returns).
``accumulator``: ``OUTPUT`` = the sum of the sequence's inputs so far, kept as implicit
state (``ACC_IN`` / ``ACC_OUT``) between requests, reset at START.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_CONTROLS = """  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }}] }},
    {{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }}] }}
  ]{state}
"""
_CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }}]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
{controls}}}
"""
_STATE = """
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1] }]"""


def _int32(*names: str) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1]) for n in names]


def _save(repo: Path, name: str, graph: onnx.GraphProto, state: bool) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    directory = repo / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    controls = _CONTROLS.format(state=_STATE if state else "")
    (directory / "config.pbtxt").write_text(_CONFIG.format(name=name, controls=controls))
    return directory


def write_simple_sequence(repo: Path, name: str = "simple_sequence") -> Path:
    """OUTPUT = INPUT + START (READY, always 1 here, multiplies the input)."""
    nodes = [
        helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
        helper.make_node("Add", ["ready_input", "START"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(nodes, name, _int32("INPUT", "START", "READY"), _int32("OUTPUT"))
    return _save(repo, name, graph, state=False)


def accumulator_nodes() -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """OUTPUT = ACC_OUT = ACC_IN * (1 - START) + INPUT * READY, and the constant it needs."""
    one = numpy_helper.from_array(np.array(1, np.int32), "one")
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
        helper.make_node("Mul", ["INPUT", "READY"], ["added"]),
        helper.make_node("Add", ["kept", "added"], ["ACC_OUT"]),
        helper.make_node("Identity", ["ACC_OUT"], ["OUTPUT"]),
    ]
    return nodes, [one]


def write_accumulator(repo: Path, name: str = "accumulator") -> Path:
    """The sum of a sequence's inputs so far (``accumulator_nodes``)."""
    nodes, constants = accumulator_nodes()
    graph = helper.make_graph(
        nodes, name, _int32("INPUT", "START", "READY", "ACC_IN"), _int32("OUTPUT", "ACC_OUT"),
        constants,
    )  # fmt: skip
    return _save(repo, name, graph, state=True)
