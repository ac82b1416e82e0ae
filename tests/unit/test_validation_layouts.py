"""Validation remembered by request layout: a repeat skips the checks, nothing else does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batchserve import validation
from batchserve.datatypes import from_wire
from batchserve.errors import InvalidArgument
from batchserve.grpc.generated.model_config_pb2 import ModelConfig
from batchserve.types import RequestedOutput, Tensor
from batchserve.validation import RequestSchema, validate_request
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
    real = validation._validate

    def counted(*args: Any) -> validation.ValidRequest:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(validation, "_validate", counted)
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
