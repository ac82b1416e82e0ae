"""Inputs `make fuzz` found that failed with something other than InvalidArgument (a 500),
each sent through every decoder that reached the failure."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import checked_shape
from batchserve.grpc import codec as grpc_codec
from batchserve.proto.grpc_service_pb2 import ModelInferRequest
from batchserve.rest import codec as rest_codec

# No elements, but the other dimensions multiply past what numpy holds: numpy raised
# ValueError("array is too big") when the decoder built the empty array.
EMPTY_BUT_HUGE = [0, 2**31, 2**31]


def test_an_empty_shape_with_huge_other_dims_is_refused_by_the_shape_check() -> None:
    with pytest.raises(InvalidArgument, match="no elements, but its other dimensions"):
        checked_shape(EMPTY_BUT_HUGE, tensor="x")
    assert checked_shape([0, 2**31], tensor="x") == (0, 2**31)  # numpy holds this one
    assert np.empty((0, 2**31)).shape == (0, 2**31)


def test_an_empty_shape_with_huge_other_dims_is_refused_as_json() -> None:
    tensor = {"name": "b", "datatype": "UINT16", "shape": EMPTY_BUT_HUGE, "data": []}
    with pytest.raises(InvalidArgument, match="no elements"):
        rest_codec.decode_infer_request(orjson.dumps({"inputs": [tensor]}), None, "m", "1")


def test_an_empty_shape_with_huge_other_dims_is_refused_as_binary() -> None:
    tensor = {"name": "b", "datatype": "FP32", "shape": EMPTY_BUT_HUGE}
    tensor["parameters"] = {"binary_data_size": 0}
    body = orjson.dumps({"inputs": [tensor]})
    with pytest.raises(InvalidArgument, match="no elements"):
        rest_codec.decode_infer_request(body, len(body), "m", "1")


@pytest.mark.parametrize("raw", [True, False])
def test_an_empty_shape_with_huge_other_dims_is_refused_over_grpc(raw: bool) -> None:
    message = ModelInferRequest(model_name="m")
    message.inputs.add(name="b", datatype="BYTES", shape=EMPTY_BUT_HUGE)
    if raw:
        message.raw_input_contents.append(b"")
    with pytest.raises(InvalidArgument, match="no elements"):
        grpc_codec.decode_infer_request(message)
