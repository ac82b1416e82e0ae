"""Small sequence models with the contract of Triton's example sequence models, so that
NVIDIA's sequence client examples run against batchserve.

``simple_sequence``: INT32 ``INPUT`` [1] -> ``OUTPUT`` [1] = INPUT + START, the START
control filled by the sequence batcher (what Triton's example ``simple_sequence`` returns).
``accumulator``: ``OUTPUT`` = the sum of the sequence's inputs so far, kept as implicit
state (``ACC_IN`` / ``ACC_OUT``) between requests, reset at START.
``simple_dyna_sequence``: ``simple_sequence`` plus the correlation id on the END request,
under the oldest strategy (what Triton's example of that name returns, and its config).
``simple_string_dyna_sequence``: the accumulator plus the correlation id, a string parsed as
an integer, on the END request (Triton's ``dyna_sequence`` test backend), on the same config
with a TYPE_STRING CORRID control.
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
_DYNA_CONTROLS = """  oldest {{ max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }}
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }}] }},
    {{ name: "END" control [{{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }}] }},
    {{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }}] }}
  ]{state}
"""
_CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }}]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
{controls}}}
"""
_STATE = """
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1] }]"""


def _int32(*names: str) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1]) for n in names]


def _save(repo: Path, name: str, graph: onnx.GraphProto, state: bool, corrid: str = "") -> Path:
    """The model and its config; ``corrid`` (a CORRID data type) asks for the dyna controls
    under the oldest strategy, with Triton's example's idle timeout."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    directory = repo / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    extra = _STATE if state else ""
    if corrid:
        controls = _DYNA_CONTROLS.format(corrid=corrid, state=extra)
    else:
        controls = _CONTROLS.format(state=extra)
    idle = 10_000_000 if corrid else 5_000_000
    config = _CONFIG.format(name=name, controls=controls, idle=idle)
    (directory / "config.pbtxt").write_text(config)
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


def _plus_id_at_end(total: str) -> list[onnx.NodeProto]:
    """OUTPUT = ``total`` + END * the correlation id (CORRID, cast to INT32)."""
    return [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
        helper.make_node("Mul", ["corrid", "END"], ["id_at_end"]),
        helper.make_node("Add", [total, "id_at_end"], ["OUTPUT"]),
    ]


def write_simple_dyna_sequence(repo: Path, name: str = "simple_dyna_sequence") -> Path:
    """OUTPUT = INPUT * READY + START + END * CORRID, the id a UINT64."""
    nodes = [
        helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
        helper.make_node("Add", ["ready_input", "START"], ["started"]),
        *_plus_id_at_end("started"),
    ]
    inputs = [*_int32("INPUT", "START", "END", "READY"), _corrid(TensorProto.UINT64)]
    graph = helper.make_graph(nodes, name, inputs, _int32("OUTPUT"))
    return _save(repo, name, graph, state=False, corrid="TYPE_UINT64")


def write_string_dyna_sequence(repo: Path, name: str = "simple_string_dyna_sequence") -> Path:
    """The running sum of the inputs + END * CORRID, the id a string holding an integer."""
    nodes, constants = accumulator_nodes()
    accumulate = [n for n in nodes if n.op_type != "Identity"]  # OUTPUT is the sum + id
    inputs = [*_int32("INPUT", "START", "END", "READY", "ACC_IN"), _corrid(TensorProto.STRING)]
    graph = helper.make_graph(
        [*accumulate, *_plus_id_at_end("ACC_OUT")], name, inputs, _int32("OUTPUT", "ACC_OUT"),
        constants,
    )  # fmt: skip
    return _save(repo, name, graph, state=True, corrid="TYPE_STRING")


def _corrid(element_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("CORRID", element_type, ["batch", 1])
