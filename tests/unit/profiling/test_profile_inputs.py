"""What `batchserve profile` has perf_analyzer send: the data given, or values generated
from the config the server completed (random 64-bit token ids would fail a model's lookup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.profiling.perf_analyzer import QUICK_WINDOW
from batchserve.profiling.plan import Axes
from batchserve.profiling.sweep import Request, _perf_args, _protocol
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

LSTM = text_format.Parse(
    "max_batch_size: 8 "
    'input { name: "tokens" data_type: TYPE_INT64 dims: [-1] } '
    'input { name: "lengths" data_type: TYPE_INT64 dims: [1] } '
    'batchserve { sequence_length_input: "lengths" }',
    ModelConfig(),
)
BF16 = text_format.Parse(
    'max_batch_size: 4 input { name: "x" data_type: TYPE_BF16 dims: [-1] }', ModelConfig()
)
# char_lstm_generate's inputs: a prompt, and optional knobs whose random values are refused
GENERATE = text_format.Parse(
    "max_batch_size: 0 model_transaction_policy { decoupled: true } "
    'input { name: "text_input" data_type: TYPE_STRING dims: [1] } '
    'input { name: "max_tokens" data_type: TYPE_INT32 dims: [1] optional: true } '
    'input { name: "temperature" data_type: TYPE_FP32 dims: [1] optional: true }',
    ModelConfig(),
)
STEP = text_format.Parse(
    'max_batch_size: 8 input { name: "token" data_type: TYPE_INT64 dims: [1] } '
    "sequence_batching { oldest { max_candidate_sequences: 8 } }",
    ModelConfig(),
)


def request(
    shapes: dict[str, tuple[int, ...]], input_data: str | None = None, protocol: str | None = None
) -> Request:
    return Request(
        repository=Path("model_repo"), model="lstm", base_config=ModelConfig(), quick=True,
        axes=Axes(None, None, None), concurrencies=[16], latency_budget_ms=None,
        protocol=protocol, window=QUICK_WINDOW, perf_analyzer=Path("perf_analyzer"),
        shapes=shapes, input_data=input_data,
    )  # fmt: skip


def test_values_are_generated_valid_for_a_lookup_with_the_free_axis_noted(tmp_path: Path) -> None:
    args, requests = _perf_args(request({}), LSTM, tmp_path)
    assert args[0] == "--input-data"
    assert args[2:] == ("--shape", "tokens:32")
    step = json.loads(Path(args[1]).read_text())["data"][0]
    assert step["tokens"]["shape"] == [32]
    assert all(1 <= token <= 9 for token in step["tokens"]["content"])
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


def test_bf16_leaves_the_values_to_perf_analyzer_and_says_so(tmp_path: Path) -> None:
    args, requests = _perf_args(request({"x": (3,)}), BF16, tmp_path)
    assert args == ("--shape", "x:3")
    assert requests == (
        "perf_analyzer's own random values "
        "(lstm: input 'x' is BF16, which perf_analyzer's JSON cannot carry)"
    )


def test_a_prompt_is_generated_and_optional_inputs_are_left_to_their_defaults(
    tmp_path: Path,
) -> None:
    """perf_analyzer's random max_tokens (1936311911) is refused by the generation backend."""
    args, requests = _perf_args(request({}), GENERATE, tmp_path)
    step = json.loads(Path(args[1]).read_text())["data"][0]
    assert list(step) == ["text_input"]
    (text,) = step["text_input"]["content"]
    assert len(text) == 16
    assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert requests.endswith(
        "optional inputs left out, the model's defaults hold: max_tokens, temperature"
    )


def test_an_optional_input_given_a_shape_is_sent(tmp_path: Path) -> None:
    args, _ = _perf_args(request({"max_tokens": (1,)}), GENERATE, tmp_path)
    step = json.loads(Path(args[1]).read_text())["data"][0]
    assert sorted(step) == ["max_tokens", "text_input"]


def test_a_sequence_model_is_sent_sequences_of_twenty_requests(tmp_path: Path) -> None:
    args, requests = _perf_args(request({}), STEP, tmp_path)
    (stream,) = json.loads(Path(args[1]).read_text())["data"]
    assert len(stream) == 20
    assert all(step == stream[0] for step in stream)
    assert 1 <= stream[0]["token"]["content"][0] <= 9
    assert requests == (
        "values generated from the config (--input-data FILE sets them); sequences of 20 requests"
    )


def test_a_decoupled_model_is_driven_over_grpc_streams() -> None:
    assert _protocol(request({}), GENERATE) == ("grpc", True)
    assert _protocol(request({}, protocol="grpc"), GENERATE) == ("grpc", True)
    assert _protocol(request({}), STEP) == ("http", False)
    assert _protocol(request({}, protocol="grpc"), STEP) == ("grpc", False)
    with pytest.raises(InvalidArgument, match="answers over gRPC streams only"):
        _protocol(request({}, protocol="http"), GENERATE)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [({"tokens": (2, 2)}, "does not fit"), ({"token": (4,)}, "has no input of that name")],
)
def test_a_shape_the_model_cannot_take_is_an_argument_error(
    tmp_path: Path, shapes: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _perf_args(request(shapes), LSTM, tmp_path)
