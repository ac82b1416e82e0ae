"""The request sample of load generators: one per input, for perf_analyzer and in-process."""

from __future__ import annotations

import numpy as np
import pytest
from batchserve.profiling.sample_inputs import DEFAULT_AXIS, parse_shape, plan, shape_flag
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format


def config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


SEQUENCE = config(
    "max_batch_size: 8 "
    'input { name: "ids" data_type: TYPE_INT32 dims: [-1] } '
    'input { name: "n" data_type: TYPE_INT64 dims: [1] } '
    'batchserve { sequence_length_input: "n" }'
)


def test_parse_shape() -> None:
    assert parse_shape("tokens:32") == ("tokens", (32,))
    assert parse_shape("ns:a:3,4") == ("ns:a", (3, 4))
    assert parse_shape(shape_flag("ns:a", (3, 4))) == ("ns:a", (3, 4))
    for bad in ("tokens", "tokens:", "tokens:x", "tokens:0", ":3"):
        with pytest.raises(ValueError, match="--shape"):
            parse_shape(bad)


def test_free_axis_from_shape_sets_the_length_input_too() -> None:
    inputs = plan("other", SEQUENCE, {"ids": (50,)})
    ids, n = (s.array for s in inputs.samples)
    assert ids.shape == (50,)
    assert ids.dtype == np.int32
    assert 1 <= ids.min() <= ids.max() <= 9
    assert n.tolist() == [50]
    assert inputs.notes == ()


def test_free_axis_defaults_and_is_noted() -> None:
    inputs = plan("other", SEQUENCE, {})
    assert inputs.samples[0].array.shape == (DEFAULT_AXIS,)
    assert "free axes of 'ids'" in inputs.notes[0]


def test_shape_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        plan("other", SEQUENCE, {"ids": (5, 5)})


def test_float_inputs_and_a_model_without_batch_axis() -> None:
    fixed = config('input { name: "x" data_type: TYPE_FP16 dims: [2, 3] }')
    inputs = plan("fixed", fixed, {})
    assert not inputs.batched
    assert inputs.feeds(16)["x"].shape == (2, 3)
    assert inputs.feeds(16)["x"].dtype == np.float16
    assert inputs.pa_data()["data"][0]["x"]["shape"] == [2, 3]


def test_strings_are_short_lowercase_lines_and_bf16_is_refused_by_name() -> None:
    text = config('max_batch_size: 4 input { name: "s" data_type: TYPE_STRING dims: [2] }')
    (sample,) = plan("strings", text, {}).samples
    assert sample.array.shape == (2,)
    assert all(len(line) == 16 and line.strip(" abcdefghijklmnopqrstuvwxyz") == ""
               for line in sample.array)  # fmt: skip
    assert sample.array[0] != sample.array[1]
    brain = config('max_batch_size: 4 input { name: "b" data_type: TYPE_BF16 dims: [1] }')
    with pytest.raises(ValueError, match="input 'b' is BF16"):
        plan("brain", brain, {})


def test_shapes_of_other_models_inputs_are_ignored() -> None:
    """A benchmark gives one set of shapes for every model it runs."""
    inputs = plan("other", SEQUENCE, {"ids": (8,), "tokens": (32,)})
    assert inputs.samples[0].array.shape == (8,)
