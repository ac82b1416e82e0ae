"""Both full decoders check a request against its model before decoding any element.

The element decoders (``array_from_bytes`` for BYTES, ``array_from_json``,
``array_from_values`` for typed gRPC contents, and ``contents_of``, which parses those
contents) are recorded as they run: a request the model refuses must never reach them.
Problems the codec finds in the header itself still come first, with their own words.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
from batchserve.core import deferred
from batchserve.core.errors import InvalidArgument, NotFound
from batchserve.core.types import InferRequest
from batchserve.core.validation import RequestSchema
from batchserve.grpc import codec as grpc_codec
from batchserve.grpc.layout_cache import MessageLayouts
from batchserve.proto.grpc_service_pb2 import ModelInferRequest
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.rest import codec as rest_codec
from batchserve.rest.header_cache import HeaderCache
from google.protobuf import text_format

CONFIG = """
name: "m"
max_batch_size: 8
input { name: "image" data_type: TYPE_FP32 dims: [4] }
input { name: "text" data_type: TYPE_STRING dims: [2] optional: true }
output { name: "y" data_type: TYPE_FP32 dims: [4] }
"""
SCHEMA = RequestSchema.of(text_format.Parse(CONFIG, ModelConfig()))
MANY = 1_000_000
"""Elements in an attack: far more than any shape the model takes."""


def schema() -> RequestSchema:
    return SCHEMA


def unknown_model() -> RequestSchema:
    raise NotFound("Request for unknown model: 'm' is not found")


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The element decoders each codec calls, recorded as they run."""
    calls: list[str] = []
    for module in (rest_codec, grpc_codec, deferred):  # deferred: fixed-size views
        for name in ("array_from_bytes", "array_from_json", "array_from_values", "contents_of"):
            real = getattr(module, name, None)
            if real is not None:
                monkeypatch.setattr(module, name, _recorded(real, name, calls))
    return calls


def _recorded(real: Any, name: str, calls: list[str]) -> Any:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    return record


def _http(inputs: list[dict[str, Any]], *binary: bytes, lookup: Any = schema) -> InferRequest:
    header = orjson.dumps({"inputs": inputs})
    body = header + b"".join(binary)
    return rest_codec.decode_infer_request(body, len(header) if binary else None, "m", "", lookup)


def _binary_bytes(name: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "BYTES",
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def _image(rows: int = 1) -> dict[str, Any]:
    return {"name": "image", "datatype": "FP32", "shape": [rows, 4], "data": [0.5] * 4 * rows}


# HTTP -------------------------------------------------------------------------------------
def test_http_binary_bytes_for_a_fixed_input_are_refused_undecoded(decoded: list[str]) -> None:
    payload = bytes(4 * MANY)
    with pytest.raises(InvalidArgument, match="input 'image': datatype BYTES does not match"):
        _http([_binary_bytes("image", [MANY], len(payload))], payload)
    assert decoded == []


def test_http_bytes_past_the_models_shape_are_refused_undecoded(decoded: list[str]) -> None:
    payload = bytes(4 * MANY)
    with pytest.raises(InvalidArgument, match=r"input 'text': shape \[1, 1000000\] does not"):
        _http([_image(), _binary_bytes("text", [1, MANY], len(payload))], payload)
    assert decoded == []


def test_http_json_data_of_a_refused_shape_is_not_converted(decoded: list[str]) -> None:
    """The data's count is wrong too: the model's problem is reported, without reading it."""
    image = {"name": "image", "datatype": "FP32", "shape": [9, 4], "data": [0.0] * MANY}
    with pytest.raises(InvalidArgument, match=r"batch size 9 is outside 1\.\.8"):
        _http([image])
    assert decoded == []


def test_http_an_unknown_model_is_refused_undecoded(decoded: list[str]) -> None:
    with pytest.raises(NotFound):
        _http([_image()], lookup=unknown_model)
    assert decoded == []


def test_http_header_problems_come_before_the_models(decoded: list[str]) -> None:
    """binary_data_size past the body's end is the codec's to say, model or not."""
    with pytest.raises(InvalidArgument, match="runs past the end of the body"):
        _http([_binary_bytes("image", [2], 12)], struct.pack("<I", 0))
    assert decoded == []


def test_http_a_valid_request_is_decoded_with_its_verdict(decoded: list[str]) -> None:
    text = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    request = _http([_image(2), _binary_bytes("text", [2, 2], 2 * len(text))], text + text)
    assert sorted(decoded) == ["array_from_bytes", "array_from_json"]
    assert request.verdict is not None
    assert request.verdict.schema is SCHEMA
    assert (request.verdict.batch_size, request.verdict.output_names) == (2, ("y",))
    assert request.inputs[1].data.tolist() == [[b"hi", b""], [b"hi", b""]]
    np.testing.assert_array_equal(request.inputs[0].data, np.full((2, 4), 0.5, np.float32))


def test_http_header_cache_checks_what_it_decodes(decoded: list[str]) -> None:
    payload = bytes(4 * 64)
    header = orjson.dumps({"inputs": [_binary_bytes("image", [64], len(payload))]})
    cache = HeaderCache()
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="datatype BYTES does not match"):
            cache.decode(header + payload, len(header), "m", "", schema)
    assert decoded == []
    assert len(cache) == 0


# gRPC -------------------------------------------------------------------------------------
def _bytes_message(name: str, shape: list[int]) -> tuple[ModelInferRequest, Any]:
    message = ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name=name, datatype="BYTES", shape=shape)
    return message, tensor


def test_grpc_bytes_contents_for_a_fixed_input_are_refused_unconverted(
    decoded: list[str],
) -> None:
    message, tensor = _bytes_message("image", [MANY])
    tensor.contents.bytes_contents.extend([b""] * MANY)
    with pytest.raises(InvalidArgument, match="input 'image': datatype BYTES does not match"):
        grpc_codec.decode_infer_request(message, schema)
    assert decoded == []


def test_grpc_raw_bytes_for_a_fixed_input_are_refused_undecoded(decoded: list[str]) -> None:
    layouts = MessageLayouts()
    for _ in range(2):  # the cache changes the message: each call gets its own, as served
        message, _ = _bytes_message("image", [MANY])
        message.raw_input_contents.append(bytes(4 * MANY))
        with pytest.raises(InvalidArgument, match="datatype BYTES does not match"):
            layouts.decode(message, schema)
    assert decoded == []
    assert len(layouts) == 0


def test_grpc_typed_contents_of_a_refused_shape_are_not_converted(decoded: list[str]) -> None:
    message = ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=[MANY // 4, 4])
    tensor.contents.fp32_contents.extend(np.zeros(MANY, np.float32))
    with pytest.raises(InvalidArgument, match=r"batch size 250000 is outside 1\.\.8"):
        grpc_codec.decode_infer_request(message, schema)
    assert decoded == []


def test_grpc_a_contents_count_is_checked_once_the_model_takes_the_header(
    decoded: list[str],
) -> None:
    """Typed contents arrive unparsed: their element count is known, and checked, only
    once they are parsed, after the model has taken the header; nothing is converted."""
    message = ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([0.0] * 5)
    with pytest.raises(InvalidArgument, match=r"contents has 5 elements, shape \[1, 4\] needs 4"):
        grpc_codec.decode_infer_request(message, schema)
    assert decoded == ["contents_of"]


def test_grpc_contents_in_the_wrong_field_are_refused_unconverted(decoded: list[str]) -> None:
    message = ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=[1, 4])
    tensor.contents.int_contents.extend([0] * 4)
    with pytest.raises(InvalidArgument, match=r"FP32 data belongs in contents\.fp32_contents"):
        grpc_codec.decode_infer_request(message, schema)
    assert decoded == ["contents_of"]


def test_grpc_a_valid_request_is_decoded_with_its_verdict(decoded: list[str]) -> None:
    message = ModelInferRequest(model_name="m")
    message.inputs.add(name="image", datatype="FP32", shape=[1, 4])
    message.inputs.add(name="text", datatype="BYTES", shape=[1, 2])
    message.raw_input_contents.extend(
        [np.ones(4, np.float32).tobytes(), struct.pack("<I", 1) + b"a" + struct.pack("<I", 0)]
    )
    request = MessageLayouts().decode(message, schema)
    assert decoded == ["array_from_bytes", "array_from_bytes"]
    assert request.verdict is not None
    assert request.verdict.schema is SCHEMA
    assert request.inputs[1].data.tolist() == [[b"a", b""]]


# Triton's order (core infer_request.cc): an input's shape against the model, then its bytes
def _fp32_binary(shape: list[int], size: int) -> dict[str, Any]:
    return {"name": "image", "datatype": "FP32", "shape": shape,
            "parameters": {"binary_data_size": size}}  # fmt: skip


def _grpc(shape: list[int], size: int) -> InferRequest:
    message = ModelInferRequest(model_name="m")
    message.inputs.add(name="image", datatype="FP32", shape=shape)
    message.raw_input_contents.append(bytes(size))
    return MessageLayouts().decode(message, schema)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_wrong_shape_is_named_before_a_wrong_byte_size_and_the_model_with_it(
    protocol: str,
) -> None:
    def send(shape: list[int], size: int) -> InferRequest:
        if protocol == "http":
            return _http([_fp32_binary(shape, size)], bytes(size))
        return _grpc(shape, size)

    with pytest.raises(InvalidArgument, match=r"^unexpected shape for input 'image' for model 'm'"):
        send([1, 5], 16)  # 20 bytes would be right for [1, 5]; the model takes [-1, 4]
    with pytest.raises(InvalidArgument) as caught:
        send([1, 4], 20)
    assert caught.value.message.startswith(
        "input byte size mismatch for input 'image' for model 'm'. Expected 16, got 20"
    )
