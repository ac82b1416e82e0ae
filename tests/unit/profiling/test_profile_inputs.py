"""What `batchserve profile` has perf_analyzer send: the data given, or values generated
from the config the server completed (random 64-bit token ids would fail a model's lookup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.profiling.perf_analyzer import QUICK_WINDOW
from batchserve.profiling.plan import Axes
from batchserve.profiling.sweep import Request, _perf_args
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

LSTM = text_format.Parse(
    "max_batch_size: 8 "
    'input { name: "tokens" data_type: TYPE_INT64 dims: [-1] } '
    'input { name: "lengths" data_type: TYPE_INT64 dims: [1] } '
    'batchserve { sequence_length_input: "lengths" }',
    ModelConfig(),
)
STRINGS = text_format.Parse(
    'max_batch_size: 4 input { name: "text" data_type: TYPE_STRING dims: [-1] }', ModelConfig()
)


def request(shapes: dict[str, tuple[int, ...]], input_data: str | None = None) -> Request:
    return Request(
        repository=Path("model_repo"), model="lstm", base_config=ModelConfig(), quick=True,
        axes=Axes(None, None, None), concurrencies=[16], latency_budget_ms=None,
        protocol="http", window=QUICK_WINDOW, perf_analyzer=Path("perf_analyzer"),
        shapes=shapes, input_data=input_data,
    )  # fmt: skip


def test_values_are_generated_valid_for_a_lookup_with_the_free_axis_noted(tmp_path: Path) -> None:
    args, requests = _perf_args(request({}), LSTM, tmp_path)
    assert args[0] == "--input-data"
    assert args[2:] == ("--shape", "tokens:32")
    step = json.loads(Path(args[1]).read_text())["data"][0]
    assert step["tokens"]["shape"] == [32]
    assert all(0 <= token <= 9 for token in step["tokens"]["content"])
    assert step["lengths"] == {"content": [32], "shape": [1]}
    assert requests == (
        "values generated from the config (--input-data FILE sets them); "
        "free axes of 'tokens' set to 32 (--shape NAME:DIMS sets them)"
    )


def test_a_given_shape_sets_the_length_too_and_is_not_noted(tmp_path: Path) -> None:
    args, requests = _perf_args(request({"tokens": (7,)}), LSTM, tmp_path)
    assert args[2:] == ("--shape", "tokens:7")
    step = json.loads(Path(args[1]).read_text())["data"][0]
    assert step["lengths"]["content"] == [7]
    assert requests == "values generated from the config (--input-data FILE sets them)"


def test_given_data_is_sent_as_it_is_with_the_shapes(tmp_path: Path) -> None:
    args, requests = _perf_args(request({"tokens": (5,)}, "mine.json"), LSTM, tmp_path)
    assert args == ("--shape", "tokens:5", "--input-data", "mine.json")
    assert requests == "the values of mine.json"
    assert not list(tmp_path.iterdir())


def test_strings_leave_the_values_to_perf_analyzer_and_say_so(tmp_path: Path) -> None:
    args, requests = _perf_args(request({"text": (3,)}), STRINGS, tmp_path)
    assert args == ("--shape", "text:3")
    assert requests == (
        "perf_analyzer's own random values (lstm: input 'text' is BYTES; numeric inputs only)"
    )


@pytest.mark.parametrize(
    ("shapes", "message"),
    [({"tokens": (2, 2)}, "does not fit"), ({"token": (4,)}, "has no input of that name")],
)
def test_a_shape_the_model_cannot_take_is_an_argument_error(
    tmp_path: Path, shapes: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _perf_args(request(shapes), LSTM, tmp_path)
