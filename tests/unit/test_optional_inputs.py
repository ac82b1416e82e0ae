"""Inputs an ONNX file gives a default for: declared optional, left out, or sent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.selection import ONNX
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import Tensor
from batchserve.core.validation import RequestSchema, validate_request
from batchserve.models.config_validation import model_problems
from batchserve.models.model_config import complete_config, parse_pbtxt
from batchserve.proto.model_config_pb2 import DataType
from onnx import TensorProto, helper
from onnx_models import build_model, write_model

FP32 = BY_WIRE["FP32"]

CONFIG = """
name: "m"
max_batch_size: 0
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
]
"""


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    model = build_model(
        [("x", TensorProto.FLOAT, (4,)), ("bias", TensorProto.FLOAT, (4,))],
        [("y", TensorProto.FLOAT, (4,))],
        initializers=[bias],
    )
    return write_model(tmp_path / "m" / "1" / "model.onnx", model)


def _problems(text: str, model_file: Path) -> list[str]:
    signature = read_onnx_signature(model_file)
    config = complete_config(parse_pbtxt(text), name="m", model_format=ONNX, signature=signature)
    return model_problems(config, signature, source="m/config.pbtxt", model_file="m/1/model.onnx")


def test_an_initializer_backed_input_is_read_as_defaulted(model_file: Path) -> None:
    signature = read_onnx_signature(model_file)
    assert [spec.name for spec in signature.inputs] == ["x"]
    assert [spec.name for spec in signature.defaulted] == ["bias"]
    assert signature.defaulted[0].shape == (4,)


def test_a_defaulted_input_may_be_declared_optional_or_left_undeclared(model_file: Path) -> None:
    assert _problems(CONFIG, model_file) == []
    assert _problems(CONFIG.replace(" optional: true", ""), model_file) == []
    assert _problems('input [{ name: "x" }]', model_file) == []


def test_only_a_defaulted_input_may_be_optional(model_file: Path) -> None:
    text = CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ] optional: true }", 1)
    assert _problems(text, model_file) == [
        "m/config.pbtxt: input 'x' is optional, but the model has no default for it (only an "
        "input backed by an ONNX initializer can be left out) (m/1/model.onnx)"
    ]


def test_a_declared_defaulted_input_gets_its_type_and_dims_from_the_file(
    model_file: Path,
) -> None:
    signature = read_onnx_signature(model_file)
    text = 'input [{ name: "x" }, { name: "bias" optional: true }]'
    config = complete_config(parse_pbtxt(text), name="m", model_format=ONNX, signature=signature)
    bias = config.input[1]
    assert (bias.data_type, list(bias.dims)) == (DataType.TYPE_FP32, [4])


def _tensor(name: str) -> Tensor:
    return Tensor(name, FP32, (4,), np.zeros(4, np.float32))


def test_an_optional_input_may_be_left_out_or_sent() -> None:
    schema = RequestSchema.of(parse_pbtxt(CONFIG))
    assert set(validate_request([_tensor("x")], None, schema).inputs) == {"x"}
    both = validate_request([_tensor("x"), _tensor("bias")], None, schema)
    assert set(both.inputs) == {"x", "bias"}


def test_no_inputs_at_all_is_valid_when_every_input_is_optional() -> None:
    text = 'name: "m" max_batch_size: 4 input [{ name: "b" data_type: TYPE_FP32 optional: true }]'
    schema = RequestSchema.of(parse_pbtxt(text))
    valid = validate_request([], None, schema)
    assert (valid.inputs, valid.batch_size) == ({}, 1)


@pytest.mark.parametrize(
    ("config", "given", "message"),
    [
        (
            CONFIG,
            [],
            "expected number of inputs between 1 and 2 but got 0 inputs for model 'm'. Got "
            "input(s) [], but missing required input(s) ['x']. Please provide all required "
            "input(s). (missing input 'x' of model 'm')",
        ),
        (
            CONFIG.replace(" optional: true", ""),
            ["bias"],
            "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['bias'], but "
            "missing required input(s) ['x']. Please provide all required input(s). "
            "(missing input 'x' of model 'm')",
        ),
    ],
)
def test_missing_inputs_are_refused_in_triton_words_first(
    config: str, given: list[str], message: str
) -> None:
    schema = RequestSchema.of(parse_pbtxt(config))
    with pytest.raises(InvalidArgument) as caught:
        validate_request([_tensor(name) for name in given], None, schema)
    assert caught.value.message == message
