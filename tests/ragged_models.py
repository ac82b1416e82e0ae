"""Models with ragged batching, as Triton's ragged-batching users write them, built with
``onnx.helper`` (unit and integration tests share them).

``ragged_sums``: each request sends a vector of its own length (``VALUES``, ragged), the
model receives every request's values back to back with the batcher's index of where each
starts (``OFFSETS``, ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``) and answers each
request's own sum: an answer that is right only when the flat tensor and the index agree,
whatever batch the request shared. It also reports what else the batcher computed
(``BATCH_ELEMENT_COUNT``, ``BATCH_ACCUMULATED_ELEMENT_COUNT``,
``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``, broadcast to each request) and hands the values back
flat, for the server to scatter by each request's shape (``BATCH_SCATTER_WITH_INPUT_SHAPE``).

``item_areas``: each request sends rows of a grid of its own height and width (ragged);
the model answers each row's area from ``BATCH_ITEM_SHAPE`` and, again, from
``BATCH_ITEM_SHAPE_FLATTEN``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 13)]
FP32, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64

RAGGED_SUMS_CONFIG = """
name: "ragged_sums"
max_batch_size: 8
input [{ name: "VALUES" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "COUNTS" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ENDS" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "LONGEST" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "ECHO" data_type: TYPE_FP32 dims: [ -1 ] }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
    data_type: TYPE_INT32 source_input: "VALUES" },
  { kind: BATCH_ELEMENT_COUNT target_name: "ELEMENTS" data_type: TYPE_FP32
    source_input: "VALUES" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "RUNNING" data_type: TYPE_INT32
    source_input: "VALUES" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX_SHAPE" data_type: TYPE_INT32
    source_input: "VALUES" }
]
batch_output [
  { target_name: "ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "VALUES" }
]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""

ITEM_AREAS_CONFIG = """
name: "item_areas"
max_batch_size: 8
input [{ name: "GRID" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }]
output [
  { name: "AREA" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "FLAT_AREA" data_type: TYPE_FP32 dims: [ 1 ] }
]
batch_input [
  { kind: BATCH_ITEM_SHAPE target_name: "SHAPES" data_type: TYPE_FP32 source_input: "GRID" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT_SHAPES" data_type: TYPE_FP32
    source_input: "GRID" }
]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""


def _info(name: str, elem_type: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def ragged_sums_model() -> onnx.ModelProto:
    """VALUES [n] + OFFSETS [r+1], ELEMENTS [r], RUNNING [r], MAX_SHAPE [m] -> SUM [r, 1],
    COUNTS [r, r], ENDS [r, r], LONGEST [r, 1], ECHO [n]."""
    nodes = [
        # running sums with a leading 0: a request's sum is the difference at its bounds
        helper.make_node("CumSum", ["VALUES", "axis0"], ["cumulative"]),
        helper.make_node("Concat", ["zero_f", "cumulative"], ["prefix"], axis=0),
        helper.make_node("Cast", ["OFFSETS"], ["offsets64"], to=INT64),
        helper.make_node("Slice", ["offsets64", "one", "big"], ["ends"]),
        helper.make_node("Slice", ["offsets64", "zero", "minus_one"], ["starts"]),
        helper.make_node("Gather", ["prefix", "ends"], ["at_end"]),
        helper.make_node("Gather", ["prefix", "starts"], ["at_start"]),
        helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axis1"], ["SUM"]),
        # one row per request, each row the whole batch's vector
        helper.make_node("Shape", ["ELEMENTS"], ["requests"]),
        helper.make_node("Concat", ["requests", "one"], ["rows_shape"], axis=0),
        helper.make_node("Unsqueeze", ["ELEMENTS", "zero"], ["elements_row"]),
        helper.make_node("Expand", ["elements_row", "rows_shape"], ["COUNTS"]),
        helper.make_node("Unsqueeze", ["RUNNING", "zero"], ["running_row"]),
        helper.make_node("Expand", ["running_row", "rows_shape"], ["ENDS"]),
        helper.make_node("Shape", ["MAX_SHAPE"], ["longest"]),
        helper.make_node("Unsqueeze", ["longest", "zero"], ["longest_row"]),
        helper.make_node("Expand", ["longest_row", "rows_shape"], ["LONGEST"]),
        helper.make_node("Identity", ["VALUES"], ["ECHO"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "axis0"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.zeros(1, dtype=np.float32), "zero_f"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
        numpy_helper.from_array(np.array([1 << 40], dtype=np.int64), "big"),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged_sums",
        [
            _info("VALUES", FP32, ["n"]),
            _info("OFFSETS", INT32, ["r1"]),
            _info("ELEMENTS", FP32, ["r"]),
            _info("RUNNING", INT32, ["r"]),
            _info("MAX_SHAPE", INT32, ["m"]),
        ],
        [
            _info("SUM", FP32, ["r", 1]),
            _info("COUNTS", FP32, ["r", "r"]),
            _info("ENDS", INT32, ["r", "r"]),
            _info("LONGEST", INT64, ["r", 1]),
            _info("ECHO", FP32, ["n"]),
        ],
        constants,
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    onnx.checker.check_model(model)
    return model


def item_areas_model() -> onnx.ModelProto:
    """GRID [n] + SHAPES [rows, 2], FLAT_SHAPES [rows * 2] -> AREA, FLAT_AREA [rows, 1]."""
    nodes = [
        helper.make_node("ReduceProd", ["SHAPES"], ["AREA"], axes=[1], keepdims=1),
        helper.make_node("Reshape", ["FLAT_SHAPES", "pairs"], ["flat_pairs"]),
        helper.make_node("ReduceProd", ["flat_pairs"], ["FLAT_AREA"], axes=[1], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "item_areas",
        [
            _info("GRID", FP32, ["n"]),
            _info("SHAPES", FP32, ["rows", 2]),
            _info("FLAT_SHAPES", FP32, ["flat"]),
        ],
        [_info("AREA", FP32, ["rows", 1]), _info("FLAT_AREA", FP32, ["rows", 1])],
        [numpy_helper.from_array(np.array([-1, 2], dtype=np.int64), "pairs")],
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    onnx.checker.check_model(model)
    return model


def save_ragged_models(repo: Path) -> None:
    """Both models, each in its own directory with its config, version 1."""
    for name, model, config in (
        ("ragged_sums", ragged_sums_model(), RAGGED_SUMS_CONFIG),
        ("item_areas", item_areas_model(), ITEM_AREAS_CONFIG),
    ):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(config)


RAGGED_SUMS_PT2_CONFIG = """
name: "ragged_sums_pt2"
backend: "pytorch"
max_batch_size: 8
input [{ name: "VALUES" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "ECHO" data_type: TYPE_FP32 dims: [ -1 ] }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
    data_type: TYPE_INT32 source_input: "VALUES" }
]
batch_output [
  { target_name: "ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "VALUES" }
]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""


def save_ragged_sums_pt2(repo: Path) -> None:
    """``ragged_sums``' sum and echo as a ``torch.export`` program (the PyTorch backend):
    VALUES [n] and OFFSETS [r+1] -> SUM [r, 1], ECHO [n]."""
    import torch

    class RaggedSums(torch.nn.Module):
        def forward(self, VALUES: torch.Tensor, OFFSETS: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
            prefix = torch.cat([VALUES.new_zeros(1), torch.cumsum(VALUES, 0)])
            bounds = OFFSETS.long()
            sums = prefix[bounds[1:]] - prefix[bounds[:-1]]
            return {"SUM": sums.unsqueeze(1), "ECHO": VALUES * 1.0}

    values = torch.export.Dim("values", min=1, max=1 << 16)
    requests = torch.export.Dim("requests", min=1, max=64)
    example = (torch.ones(5), torch.tensor([0, 2, 5], dtype=torch.int32))
    shapes = {"VALUES": {0: values}, "OFFSETS": {0: requests + 1}}
    program = torch.export.export(RaggedSums(), example, dynamic_shapes=shapes)
    (repo / "ragged_sums_pt2" / "1").mkdir(parents=True)
    torch.export.save(program, str(repo / "ragged_sums_pt2" / "1" / "model.pt2"))
    (repo / "ragged_sums_pt2" / "config.pbtxt").write_text(RAGGED_SUMS_PT2_CONFIG)
