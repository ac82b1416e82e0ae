"""Configs with ragged batching: Triton's checks in its words, the model file's checks, and
what batchserve refuses rather than misread."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.selection import ONNX
from batchserve.models.config_validation import config_problems, model_problems
from batchserve.models.model_config import complete_config, parse_pbtxt
from onnx import TensorProto, helper

from tests.ragged_models import RAGGED_SUMS_CONFIG, ragged_sums_model

BASE = """
name: "m"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }]
"""


def _problems(extra: str, base: str = BASE) -> list[str]:
    config = parse_pbtxt(base + extra)
    return config_problems(config, source="m/config.pbtxt", directory="m")


def test_the_shipped_example_configs_have_no_problems() -> None:
    config = parse_pbtxt(RAGGED_SUMS_CONFIG)
    assert config_problems(config, source="c", directory="ragged_sums") == []


@pytest.mark.parametrize(
    ("extra", "triton"),
    [
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 }]',
         "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
        ('batch_input [{ kind: BATCH_ITEM_SHAPE target_name: "n" data_type: TYPE_FP32 '
         'source_input: ["x", "x"] }]',
         "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 2"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT64 '
         'source_input: "x" }]', "batch input data type must be TYPE_INT32 or TYPE_FP32"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 '
         'source_input: "nope" }]', "unknown source input name 'nope'"),
        ('batch_output [{ target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE }]',
         "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"),
        ('batch_output [{ target_name: "y" source_input: "nope" }]',
         "unknown source input name 'nope'"),
        ('batch_output [{ target_name: "z" source_input: "x" }]',
         "unknown target output name 'z'"),
        ('batch_output [{ target_name: ["y", "y"] source_input: "x" }]',
         "target output name 'y' can only be specified once"),
    ],
)  # fmt: skip
def test_tritons_batch_io_checks_in_its_words(extra: str, triton: str) -> None:
    assert _problems(extra) == [f"m/config.pbtxt: {triton} for m"]


@pytest.mark.parametrize(
    ("extra", "base_change", "words"),
    [
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT data_type: TYPE_INT32 source_input: "x" }]',
         None, "batch_input[0] names no target_name"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "x" data_type: TYPE_INT32 '
         'source_input: "x" }]', None, "batch input target 'x' is also an input of the config"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 '
         'source_input: "x" }, { kind: BATCH_ITEM_SHAPE target_name: "n" data_type: TYPE_INT32 '
         'source_input: "x" }]', None, "batch input target 'n' is named by 2 batch inputs"),
        ("", ("allow_ragged_batch: true", "allow_ragged_batch: true optional: true"),
         "configuration expects model provides input with shape [-1] for ragged input 'x', "
         "which is not supported for optional input"),
        ("", ("allow_ragged_batch: true", "allow_ragged_batch: true reshape { shape: [ -1 ] }"),
         "input 'x' is ragged and has a reshape"),
        ('batch_output [{ target_name: "y" source_input: "x" }]',
         ("dims: [ -1 ] }]\n", "dims: [ -1 ] reshape { shape: [ -1 ] } }]\n"),
         "output 'y' is a batch output and has a reshape"),
        ('batchserve { sequence_length_input: "x" }', None,
         "batchserve.sequence_length_input pads requests to one length"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 '
         'source_input: "z" }]',
         ("output [", 'input [{ name: "z" data_type: TYPE_FP32 dims: [ 2 ] optional: true }]\n'
                      "output ["),
         "input 'z' is optional and the source of a batch input or output"),
    ],
)  # fmt: skip
def test_what_would_be_misread_is_refused(
    extra: str, base_change: tuple[str, str] | None, words: str
) -> None:
    base = BASE if base_change is None else BASE.replace(*base_change)
    problems = [p for p in _problems(extra, base) if words in p]
    assert len(problems) == 1, _problems(extra, base)


def _saved(tmp_path: Path, model: onnx.ModelProto) -> Path:
    path = tmp_path / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
    return path


def _model_problems(text: str, path: Path) -> list[str]:
    signature = read_onnx_signature(path)
    config = complete_config(parse_pbtxt(text), name="m", model_format=ONNX, signature=signature)
    return model_problems(config, signature, source="c", model_file="m/1/model.onnx")


def test_batch_input_targets_are_the_models_inputs_and_not_the_clients(tmp_path: Path) -> None:
    path = _saved(tmp_path, ragged_sums_model())
    assert _model_problems(RAGGED_SUMS_CONFIG, path) == []
    listed_none = (
        RAGGED_SUMS_CONFIG.split("input [{", 1)[0]
        + "output"
        + RAGGED_SUMS_CONFIG.split("output", 1)[1]
    )
    completed = complete_config(
        parse_pbtxt(listed_none), name="ragged_sums", model_format=ONNX,
        signature=read_onnx_signature(path),
    )  # fmt: skip
    assert [t.name for t in completed.input] == ["VALUES"]  # the batcher's are not listed
    wrong_type = RAGGED_SUMS_CONFIG.replace(
        'target_name: "OFFSETS"\n    data_type: TYPE_INT32',
        'target_name: "OFFSETS"\n    data_type: TYPE_FP32',
    )
    assert wrong_type != RAGGED_SUMS_CONFIG
    assert _model_problems(wrong_type, path) == [
        "c: batch input target 'OFFSETS': data_type TYPE_FP32 contradicts the model's TYPE_INT32 "
        "(m/1/model.onnx)"
    ]
    missing = RAGGED_SUMS_CONFIG.replace('target_name: "RUNNING"', 'target_name: "RUNNING_TOTAL"')
    problems = _model_problems(missing, path)
    assert len(problems) == 2, problems
    assert "model input 'RUNNING' is missing from the config's inputs" in problems[0]
    assert "batch input target 'RUNNING_TOTAL' is not an input of the model" in problems[1]


def test_a_ragged_input_must_be_one_flat_axis_in_the_model(tmp_path: Path) -> None:
    """The ONNX Runtime backend's check and text (two spaces included)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "n"])],
    )
    path = _saved(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert _model_problems(BASE, path) == [
        "c: unable to load model 'm', configuration expects model provides input with shape "
        "[-1]  for ragged input 'x', model provides [-1,-1] (m/1/model.onnx)"
    ]
