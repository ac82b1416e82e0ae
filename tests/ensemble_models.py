"""A small ensemble and its composing ONNX models, for the ensemble tests.

``pipeline`` (FP32 [-1, 4] in, out): ``doubler`` writes 2 x IN, ``adder`` adds IN to that
and ``negater`` negates IN at the same time, so OUT = 3 x IN and NEG = -IN: one step reads
another's output, two run side by side. The composing models batch (dynamic batching,
with a queue delay long enough that concurrent ensemble requests meet in their queues).
``picking`` (``write_picking``) is a pipeline whose second step fails at run time on
values it cannot look up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROW = 4
ENSEMBLE = "pipeline"


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str]) -> None:
    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", ROW])

    graph = helper.make_graph(
        nodes, path.parent.parent.name, [info(n) for n in inputs], [info(n) for n in outputs],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _config(name: str, inputs: list[str], outputs: list[str], batching: str) -> str:
    def tensors(kind: str, names: list[str]) -> str:
        body = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {ROW} ] }}' for n in names)
        return f"{kind} [ {body} ]\n"

    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        + tensors("input", inputs)
        + tensors("output", outputs)
        + batching
    )


def write_composing_models(repo: Path, delay_us: int = 20_000) -> None:
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
    mul = helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])
    _save(repo / "doubler" / "1" / "model.onnx", [mul], ["INPUT0"], ["OUTPUT0"])
    (repo / "doubler" / "config.pbtxt").write_text(
        _config("doubler", ["INPUT0"], ["OUTPUT0"], batching)
    )
    add = helper.make_node("Add", ["A", "B"], ["SUM"])
    _save(repo / "adder" / "1" / "model.onnx", [add], ["A", "B"], ["SUM"])
    (repo / "adder" / "config.pbtxt").write_text(_config("adder", ["A", "B"], ["SUM"], batching))
    neg = helper.make_node("Neg", ["X"], ["Y"])
    _save(repo / "negater" / "1" / "model.onnx", [neg], ["X"], ["Y"])
    (repo / "negater" / "config.pbtxt").write_text(_config("negater", ["X"], ["Y"], batching))


ENSEMBLE_CONFIG = f"""
name: "{ENSEMBLE}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ROW} ] }},
  {{ name: "NEG" data_type: TYPE_FP32 dims: [ {ROW} ] }}
]
ensemble_scheduling {{
  step [
    {{
      model_name: "doubler"
      model_version: -1
      input_map {{ key: "INPUT0" value: "IN" }}
      output_map {{ key: "OUTPUT0" value: "twice" }}
    }},
    {{
      model_name: "adder"
      model_version: -1
      input_map {{ key: "A" value: "twice" }}
      input_map {{ key: "B" value: "IN" }}
      output_map {{ key: "SUM" value: "OUT" }}
    }},
    {{
      model_name: "negater"
      model_version: -1
      input_map {{ key: "X" value: "IN" }}
      output_map {{ key: "Y" value: "NEG" }}
    }}
  ]
}}
"""


def write_ensemble(repo: Path, config: str = ENSEMBLE_CONFIG, name: str = ENSEMBLE) -> Path:
    """The ensemble's directory: its config and an empty version directory, as Triton's."""
    directory = repo / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(config)
    return directory


def write_pipeline_repository(repo: Path, delay_us: int = 20_000) -> Path:
    write_composing_models(repo, delay_us)
    write_ensemble(repo)
    return repo


NESTED = "nested"
NESTED_CONFIG = f"""
name: "{NESTED}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "{ENSEMBLE}"
      model_version: -1
      input_map {{ key: "IN" value: "X" }}
      output_map {{ key: "OUT" value: "Y" }}
    }}
  ]
}}
"""
"""The pipeline as the one step of another ensemble: its steps are the grandchildren."""


UNBATCHED = "pipeline_unbatched"
UNBATCHED_CONFIG = f"""
name: "{UNBATCHED}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "doubler"
      input_map {{ key: "INPUT0" value: "IN" }}
      output_map {{ key: "OUTPUT0" value: "OUT" }}
    }}
  ]
}}
"""
"""Triton's nobatch_to_batch: a request without a batch axis reaches the batching doubler as
a batch of 1, and its answer comes back without one."""

RESHAPED = "pipeline_reshaped"
RESHAPED_CONFIG = f"""
name: "{RESHAPED}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: {{ shape: [ {ROW} ] }} }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: {{ shape: [ {ROW} ] }} }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "doubler"
      input_map {{ key: "INPUT0" value: "IN" }}
      output_map {{ key: "OUTPUT0" value: "OUT" }}
    }}
  ]
}}
"""
"""Clients send and receive [2, 2] rows; the steps see the reshaped [4]."""


OPTIONAL = "pipeline_optional"
OPTIONAL_CONFIG = f"""
name: "{OPTIONAL}"
platform: "ensemble"
max_batch_size: 8
input [
  {{ name: "IN" data_type: TYPE_FP32 dims: [ {ROW} ] }},
  {{ name: "SHIFT" data_type: TYPE_FP32 dims: [ {ROW} ] optional: true }}
]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "shifter"
      input_map {{ key: "X" value: "IN" }}
      input_map {{ key: "B" value: "SHIFT" }}
      output_map {{ key: "Y" value: "OUT" }}
    }}
  ]
}}
"""
"""Triton's optional ensemble inputs: SHIFT left out reaches ``shifter`` as nothing, so its
own default (zeros) applies."""


def write_shifter(repo: Path) -> None:
    """Y = X + B, B optional: an ONNX initializer of zeros backs it when a request has none."""

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", ROW])

    zeros = helper.make_tensor("B", TensorProto.FLOAT, [1, ROW], [0.0] * ROW)
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "B"], ["Y"])], "shifter",
        [info("X"), helper.make_tensor_value_info("B", TensorProto.FLOAT, [None, ROW])],
        [info("Y")], initializer=[zeros],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = repo / "shifter" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    (repo / "shifter" / "config.pbtxt").write_text(
        f'name: "shifter"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {ROW} ] }}, '
        f'{{ name: "B" data_type: TYPE_FP32 dims: [ {ROW} ] optional: true }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]\n'
    )


PICKING = "picking"
PICKING_CONFIG = f"""
name: "{PICKING}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "doubler"
      model_version: -1
      input_map {{ key: "INPUT0" value: "IN" }}
      output_map {{ key: "OUTPUT0" value: "twice" }}
    }},
    {{
      model_name: "picker"
      model_version: -1
      input_map {{ key: "X" value: "twice" }}
      output_map {{ key: "Y" value: "OUT" }}
    }}
  ]
}}
"""


def write_picking(repo: Path) -> None:
    """``picking``: the doubler, then ``picker``, which looks each value up in a table of
    four (ONNX Gather): a value past the table fails the second step at run time."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", ROW])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", ROW])
    table = numpy_helper.from_array(np.arange(10, 14, dtype=np.float32), "table")
    nodes = [
        helper.make_node("Cast", ["X"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "index"], ["Y"], axis=0),
    ]
    graph = helper.make_graph(nodes, "picker", [x], [y], initializer=[table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "picker" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "picker" / "1" / "model.onnx"))
    (repo / "picker" / "config.pbtxt").write_text(_config("picker", ["X"], ["Y"], ""))
    write_ensemble(repo, PICKING_CONFIG, PICKING)
