"""Triton's raw binary request: the body alone, shaped by the model's configuration."""

from __future__ import annotations

import numpy as np
import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.dataplane.raw_input import raw_request
from batchserve.proto.model_config_pb2 import ModelConfig
from fakes import fake_config
from google.protobuf import text_format


def _config(inputs: str, max_batch_size: int = 0) -> ModelConfig:
    config = fake_config(max_batch_size=max_batch_size)
    config.ClearField("input")
    text_format.Merge(inputs, config)
    return config


def test_the_body_becomes_the_one_input_with_a_batch_of_one() -> None:
    body = np.arange(4, dtype=np.float32).tobytes()
    request = raw_request(body, fake_config(), "fake", "1")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype.wire, tensor.shape) == ("x", "FP32", (1, 4))
    assert tensor.data.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert (request.model_name, request.model_version) == ("fake", "1")
    assert request.binary_output  # Triton answers raw requests with binary outputs


def test_a_model_without_batching_takes_the_dims_as_they_are() -> None:
    config = _config('input { name: "v" data_type: TYPE_INT16 dims: [2, 2] }')
    request = raw_request(np.arange(4, dtype="<i2").tobytes(), config, "m", "")
    assert request.inputs[0].shape == (2, 2)


def test_one_variable_dimension_is_deduced_from_the_body_size() -> None:
    config = _config('input { name: "v" data_type: TYPE_FP32 dims: [-1, 3] }', 4)
    request = raw_request(bytes(4 * 3 * 5), config, "m", "")
    assert request.inputs[0].shape == (1, 5, 3)
    # a size that is no whole number of rows keeps Triton's byte-size check
    with pytest.raises(
        InvalidArgument, match=r"^input byte size mismatch for input 'v' for model 'm'\."
    ):
        raw_request(bytes(4 * 3 * 5 + 4), config, "m", "")


def test_two_variable_dimensions_cannot_be_deduced() -> None:
    config = _config('input { name: "v" data_type: TYPE_FP32 dims: [-1, -1] }')
    with pytest.raises(InvalidArgument) as info:
        raw_request(bytes(16), config, "m", "")
    assert info.value.message.startswith(
        "The shape of the raw input 'v' can not be deduced because there are more than one "
        "variable-sized dimension"
    )


def test_models_with_several_inputs_are_refused_with_tritons_text() -> None:
    config = _config(
        'input { name: "a" data_type: TYPE_FP32 dims: [1] }'
        'input { name: "b" data_type: TYPE_FP32 dims: [1] }'
    )
    with pytest.raises(InvalidArgument) as info:
        raw_request(bytes(4), config, "two", "")
    assert info.value.message.startswith(
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'two' model configuration (batchserve: "
    )


def test_a_bytes_input_is_the_whole_body_as_one_element() -> None:
    config = _config('input { name: "s" data_type: TYPE_STRING dims: [1] }', 8)
    request = raw_request(b"\xff raw text", config, "m", "")
    tensor = request.inputs[0]
    assert (tensor.datatype.wire, tensor.shape) == ("BYTES", (1, 1))
    assert tensor.data.tolist() == [[b"\xff raw text"]]
    wide = _config('input { name: "s" data_type: TYPE_STRING dims: [2] }')
    with pytest.raises(InvalidArgument, match=r"^For BYTE datatype raw input 's', the model"):
        raw_request(b"abc", wide, "m", "")


def test_a_size_that_does_not_fit_the_fixed_shape_is_a_byte_size_mismatch() -> None:
    with pytest.raises(InvalidArgument) as info:
        raw_request(bytes(12), fake_config(), "fake", "")
    assert info.value.message.startswith(
        "input byte size mismatch for input 'x' for model 'fake'. Expected 16, got 12"
    )
