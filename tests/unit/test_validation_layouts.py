"""Validation remembered by request layout, or decided by the decoder before the data was
decoded (a ``Verdict``): a repeat, or a request with a verdict for this very schema, skips
the checks; nothing else does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batchserve.core import validation
from batchserve.core.datatypes import from_wire
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestedOutput, Tensor, Verdict
from batchserve.core.validation import RequestSchema, check_request, validate_request
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

CONFIG = """
name: "m"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [4] }
output { name: "y" data_type: TYPE_FP32 dims: [4] }
output { name: "z" data_type: TYPE_FP32 dims: [1] }
"""


def _schema() -> RequestSchema:
    return RequestSchema.of(text_format.Parse(CONFIG, ModelConfig()))


def _x(array: np.ndarray, datatype: str = "FP32") -> list[Tensor]:
    return [Tensor("x", from_wire(datatype, tensor="x"), array.shape, array)]


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per full validation (which still runs)."""
    calls: list[int] = []
    real = validation._check

    def counted(*args: Any) -> tuple[int, tuple[str, ...]]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(validation, "_check", counted)
    return calls


def test_a_layout_that_passed_is_not_checked_again(checks: list[int]) -> None:
    schema, outputs = _schema(), [RequestedOutput("z")]
    first = validate_request(_x(np.zeros((2, 4), np.float32)), outputs, schema, "L")
    second_x = np.ones((2, 4), np.float32)
    second = validate_request(_x(second_x), outputs, schema, "L")
    assert len(checks) == 1
    assert (second.batch_size, second.output_names) == (first.batch_size, first.output_names)
    assert (second.batch_size, second.output_names) == (2, ("z",))
    assert second.inputs["x"] is second_x


def test_without_a_layout_every_request_is_checked(checks: list[int]) -> None:
    schema = _schema()
    for _ in range(3):
        validate_request(_x(np.zeros((1, 4), np.float32)), None, schema)
    assert len(checks) == 3
    assert len(schema.passed) == 0


def test_a_layout_that_failed_fails_every_time(checks: list[int]) -> None:
    schema = _schema()
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="shape \\[1, 3\\] does not match"):
            validate_request(_x(np.zeros((1, 3), np.float32)), None, schema, "bad")
    assert len(checks) == 2
    assert "bad" not in schema.passed


def test_each_loaded_schema_starts_empty(checks: list[int]) -> None:
    old = _schema()
    validate_request(_x(np.zeros((1, 4), np.float32)), None, old, "L")
    reloaded = _schema()
    validate_request(_x(np.zeros((1, 4), np.float32)), None, reloaded, "L")
    assert len(checks) == 2


def test_a_verdict_for_this_schema_is_not_checked_again(checks: list[int]) -> None:
    schema, x = _schema(), np.ones((3, 4), np.float32)
    verdict = check_request(_x(x), [RequestedOutput("y")], schema)
    assert verdict == Verdict(schema, 3, ("y",))
    valid = validate_request(_x(x), [RequestedOutput("y")], schema, None, verdict)
    assert len(checks) == 1
    assert (valid.batch_size, valid.output_names) == (3, ("y",))
    assert valid.inputs["x"] is x


def test_a_verdict_for_another_schema_is_checked_again(checks: list[int]) -> None:
    """A model reloaded between decoding and inference has a new schema."""
    old, reloaded = _schema(), _schema()
    verdict = check_request(_x(np.ones((1, 4), np.float32)), None, old)
    validate_request(_x(np.ones((1, 4), np.float32)), None, reloaded, None, verdict)
    assert len(checks) == 2


def test_a_verdict_is_remembered_for_its_layout(checks: list[int]) -> None:
    schema, x = _schema(), np.ones((2, 4), np.float32)
    verdict = check_request(_x(x), None, schema)
    validate_request(_x(x), None, schema, "L", verdict)
    validate_request(_x(x), None, schema, "L")
    assert len(checks) == 1
    assert schema.passed.get("L") == (2, ("y", "z"))


def test_checking_reads_no_data(checks: list[int]) -> None:
    """The decoders check a request before decoding its data: shapes are all it reads."""
    empty = np.empty(0)
    tensor = Tensor("x", from_wire("FP32", tensor="x"), (5, 4), empty)
    assert check_request([tensor], None, _schema()).batch_size == 5
    wrong = Tensor("x", from_wire("BYTES", tensor="x"), (5, 4), empty)
    with pytest.raises(InvalidArgument, match="input 'x': datatype BYTES does not match"):
        check_request([wrong], None, _schema())
