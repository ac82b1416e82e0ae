"""The generate extension's JSON: keys to tensors by the model's metadata (Triton's shape
rule), other keys to parameters, responses flattened as Triton writes them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import InferResponse, ModelMetadata, Tensor, TensorMetadata
from batchserve.rest.generate import _shape, generate_request, response_json

METADATA = ModelMetadata(
    "m", ("1",), "", (
        TensorMetadata("text_input", "BYTES", (1,)),
        TensorMetadata("max_tokens", "INT32", (1,)),
        TensorMetadata("IN", "INT32", (-1,)),
        TensorMetadata("grid", "FP32", (-1, 2)),
    ), (),
)  # fmt: skip
PLANE = SimpleNamespace(model_metadata=lambda name, version: METADATA)


def _request(body: dict) -> object:
    return generate_request(PLANE, body, "m", "")  # type: ignore[arg-type]


def test_keys_naming_inputs_become_tensors_and_the_rest_parameters() -> None:
    body = {"text_input": "hi", "max_tokens": 3, "IN": [1, 2, 3], "id": "q",
            "grid": [1, 2, 3, 4], "note": "x", "parameters": {"priority": 1}}  # fmt: skip
    request = _request(body)
    tensors = {t.name: t for t in request.inputs}  # type: ignore[attr-defined]
    assert tensors["text_input"].data.tolist() == [b"hi"]
    assert tensors["max_tokens"].data.dtype == np.int32
    assert tensors["max_tokens"].shape == (1,)
    assert tensors["IN"].shape == (3,)
    assert tensors["grid"].shape == (2, 2)
    assert request.id == "q"  # type: ignore[attr-defined]
    assert request.parameters == {"note": "x"}  # type: ignore[attr-defined]
    assert request.priority == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"grid": [1, 2, 3]}, "can not convert input 'grid'"),
        ({"max_tokens": [1, 2]}, "can not convert input 'max_tokens'"),
        (
            {"max_tokens": 1.5},
            r"^Unable to parse 'data': attempt to access JSON non-signed-integer "
            r"as signed-integer \(batchserve: tensor 'max_tokens': INT32 data must be integers, "
            r"got 1.5\)$",
        ),
        ({"max_tokens": 2**40}, "outside the range of INT32"),
        ({"text_input": 7}, "attempt to access JSON non-string as string"),
        ({"text_input": {"USER": "hi"}}, "attempt to access JSON non-string as string"),
        ({"note": {"a": 1}}, "parameter 'note' has invalid type"),
        ({"parameters": 3}, "Expected JSON object for keyword: 'parameters'"),
    ],
)
def test_bad_bodies_are_refused_naming_the_key(body: dict, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        _request(body)


def test_the_shape_rule() -> None:
    assert _shape("x", (-1, 3, -1), 12) == (1, 3, 4)
    assert _shape("x", (2,), 2) == (2,)
    with pytest.raises(InvalidArgument):
        _shape("x", (2,), 3)


def test_a_response_is_flat_json_one_element_bare() -> None:
    one = Tensor("text_output", BY_WIRE["BYTES"], (1,), np.array([b"a"], dtype=np.object_))
    many = Tensor("OUT", BY_WIRE["INT32"], (2, 1), np.array([[1], [2]], np.int32))
    response = InferResponse("m", "1", "", [one, many])
    assert orjson.loads(response_json(response)) == {
        "model_name": "m", "model_version": "1", "text_output": "a", "OUT": [1, 2],
    }  # fmt: skip
