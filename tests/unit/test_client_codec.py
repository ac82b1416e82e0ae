"""batchserve_client's encodings, without a server: numpy to wire bytes and back, and the
REST bodies checked against the server's own codec (the gRPC wire is checked against the
real server in test_client.py)."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.types import InferRequest as ServerRequest
from batchserve.core.types import InferResponse, RequestedOutput, Tensor
from batchserve.rest.codec import decode_infer_request, encode_infer_response
from batchserve_client import InvalidArgument, InvalidResponse
from batchserve_client._connect import Settings
from batchserve_client._grpc import message_dict
from batchserve_client._grpc import read_infer as read_grpc
from batchserve_client._http import encode_infer, read_infer, retry_after
from batchserve_client._infer import build_request
from batchserve_client._proto import v2_pb2 as pb
from batchserve_client.errors import (
    DeadlineExceeded,
    Internal,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    from_grpc_code,
    from_http_status,
)
from batchserve_client.tensors import datatype_of, from_bytes, prepare, to_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

NUMERIC = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
NUMERIC += ["float16", "float32", "float64"]


@pytest.mark.parametrize(
    ("dtype", "wire"),
    [
        ("bool", "BOOL"),
        ("uint8", "UINT8"),
        ("uint16", "UINT16"),
        ("uint32", "UINT32"),
        ("uint64", "UINT64"),
        ("int8", "INT8"),
        ("int16", "INT16"),
        ("int32", "INT32"),
        ("int64", "INT64"),
        ("float16", "FP16"),
        ("float32", "FP32"),
        ("float64", "FP64"),
        ("object", "BYTES"),
        ("S3", "BYTES"),
        ("U3", "BYTES"),
    ],
)
def test_the_datatype_comes_from_the_dtype(dtype: str, wire: str) -> None:
    assert datatype_of(np.zeros(2, dtype=dtype), name="x") == wire


def test_dtypes_without_a_datatype_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"input 'z': arrays of dtype complex64"):
        prepare(np.zeros(2, np.complex64), None, name="z")


def test_a_named_datatype_casts_within_the_kind_only() -> None:
    datatype, array = prepare(np.array([1.5, 2.5]), "fp32", name="x")
    assert (datatype, array.dtype) == ("FP32", np.float32)
    with pytest.raises(InvalidArgument, match=r"input 'x': dtype float64 cannot be sent as INT32"):
        prepare(np.array([1.5]), "INT32", name="x")
    with pytest.raises(InvalidArgument, match="unknown datatype 'FP33'"):
        prepare(np.array([1.5]), "FP33", name="x")


def test_bytes_elements_are_length_prefixed() -> None:
    datatype, array = prepare(np.array([b"", b"a\x00b", "é"], dtype=object), None, name="s")
    raw = to_bytes(array, datatype)
    assert raw == b"".join(struct.pack("<I", len(s)) + s for s in (b"", b"a\x00b", "é".encode()))
    assert from_bytes(raw, "BYTES", (3,)).tolist() == [b"", b"a\x00b", "é".encode()]
    with pytest.raises(InvalidResponse, match="runs past the data"):
        from_bytes(raw[:-1], "BYTES", (3,))
    with pytest.raises(InvalidArgument, match="BYTES elements must be bytes or str, got int"):
        prepare(np.array([b"a", 3], dtype=object), None, name="s")


def test_bf16_rounds_to_nearest_even_and_comes_back_as_float32() -> None:
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.nan, np.inf], dtype=np.float32)
    datatype, bits = prepare(values, "BF16", name="h")
    back = from_bytes(to_bytes(bits, datatype), "BF16", (6,))
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back[:4], [1.0, 1.0, 1 + 2**-6, -2.5])
    assert np.isnan(back[4])
    assert back[5] == np.inf
    raw_bits = np.array([0x3F80], dtype=np.uint16)
    assert prepare(raw_bits, "BF16", name="h")[1].tolist() == [0x3F80]


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(NUMERIC).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    )
)
def test_numeric_arrays_survive_the_wire(array: np.ndarray) -> None:
    datatype, prepared = prepare(array, None, name="x")
    back = from_bytes(to_bytes(prepared, datatype), datatype, array.shape)
    np.testing.assert_array_equal(back, array)
    assert back.dtype == array.dtype


def test_an_output_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(InvalidResponse, match=r"output has 8 bytes, shape \[3\] FP32 needs 12"):
        from_bytes(b"\0" * 8, "FP32", (3,))


def _request(binary: bool) -> tuple[ServerRequest, dict[str, Any]]:
    inputs = {
        "image": np.arange(12, dtype=np.float32).reshape(2, 6),
        "ids": np.array([[1, -2]], dtype=np.int64),
        "text": np.array(["a", "bé"], dtype=object),
    }
    request = build_request(
        "m", inputs, outputs=["out"], request_id="r1", priority=2, queue_timeout=0.25
    )
    body, headers = encode_infer(request, binary=binary)
    length = headers.get("Inference-Header-Content-Length")
    decoded = decode_infer_request(body, None if length is None else int(length), "m", "")
    return decoded, inputs


@pytest.mark.parametrize("binary", [True, False])
def test_the_server_reads_what_the_client_writes(binary: bool) -> None:
    decoded, inputs = _request(binary)
    assert [t.name for t in decoded.inputs] == list(inputs)
    for tensor in decoded.inputs:
        expected = inputs[tensor.name]
        if tensor.datatype.wire == "BYTES":
            expected = np.array([s.encode() for s in expected], dtype=object)
        np.testing.assert_array_equal(tensor.data, expected)
    assert [o.name for o in decoded.outputs or ()] == ["out"]
    assert (decoded.id, decoded.priority, decoded.timeout_us) == ("r1", 2, 250_000)
    assert decoded.binary_output is binary


def test_json_bodies_refuse_what_json_cannot_carry() -> None:
    not_utf8 = build_request("m", {"s": np.array([b"\xff"], dtype=object)})
    with pytest.raises(InvalidArgument, match="input 's': BYTES that are not UTF-8"):
        encode_infer(not_utf8, binary=False)
    bf16 = build_request("m", {"h": np.ones(2, np.float32)}, datatypes={"h": "BF16"})
    with pytest.raises(InvalidArgument, match="input 'h': BF16 cannot be sent as JSON"):
        encode_infer(bf16, binary=False)
    body, _ = encode_infer(bf16, binary=True)  # binary data carries both
    assert body.endswith(np.array([0x3F80, 0x3F80], "<u2").tobytes())


def _response(request: ServerRequest) -> httpx.Response:
    outputs = [
        Tensor("probs", BY_WIRE["FP32"], (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
        Tensor("label", BY_WIRE["BYTES"], (2,), np.array([b"cat", b"\xff"], dtype=object)),
    ]
    chunks, length = encode_infer_response(InferResponse("m", "1", "r1", outputs), request)
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    return httpx.Response(200, headers=headers, content=b"".join(bytes(c) for c in chunks))


@pytest.mark.parametrize("binary", [True, False])
def test_the_client_reads_what_the_server_writes(binary: bool) -> None:
    request = ServerRequest(
        "m", id="r1", outputs=[RequestedOutput("probs"), RequestedOutput("label")]
    )
    request.binary_output = binary
    result = read_infer(_response(request))
    assert (result.model_name, result.model_version, result.id) == ("m", "1", "r1")
    np.testing.assert_array_equal(result["probs"], np.arange(6, dtype=np.float32).reshape(2, 3))
    # b"\xff" is not UTF-8: the server sends that output as binary data even in JSON mode
    assert result["label"].tolist() == [b"cat", b"\xff"]


def test_a_truncated_binary_answer_is_refused() -> None:
    request = ServerRequest("m", binary_output=True)
    response = _response(request)
    cut = httpx.Response(200, headers=response.headers, content=response.content[:-2])
    with pytest.raises(InvalidResponse, match="runs past the end of the body"):
        read_infer(cut)


def test_grpc_typed_contents_are_read_when_raw_contents_are_absent() -> None:
    output = pb.ModelInferResponse.InferOutputTensor
    response = pb.ModelInferResponse(
        model_name="m",
        outputs=[
            output(
                name="x", datatype="INT32", shape=[2, 2], contents={"int_contents": [1, 2, 3, 4]}
            ),
            output(name="s", datatype="BYTES", shape=[1], contents={"bytes_contents": [b"hi"]}),
        ],
        parameters={"sequence_end": pb.InferParameter(bool_param=True)},
    )
    result = read_grpc(response)
    np.testing.assert_array_equal(result["x"], np.array([[1, 2], [3, 4]], dtype=np.int32))
    assert result["x"].dtype == np.int32
    assert result["s"].tolist() == [b"hi"]
    assert result.parameters == {"sequence_end": True}


def test_grpc_raw_contents_must_match_the_outputs() -> None:
    response = pb.ModelInferResponse(
        outputs=[pb.ModelInferResponse.InferOutputTensor(name="x", datatype="FP32", shape=[1])],
        raw_output_contents=[b"\0" * 4, b"\0" * 4],
    )
    with pytest.raises(InvalidResponse, match="2 raw_output_contents for 1 outputs"):
        read_grpc(response)


def test_grpc_messages_read_like_the_rest_json() -> None:
    config = pb.ModelConfig(
        name="m", max_batch_size=8, input=[pb.ModelInput(name="x", dims=[-1, 3])]
    )
    doc = message_dict(config)
    assert doc["input"][0]["dims"] == [-1, 3]
    assert doc["max_batch_size"] == 8
    assert doc["input"][0]["data_type"] == "TYPE_INVALID"  # every field is shown


def test_request_arguments_are_checked() -> None:
    x = {"x": np.zeros(1, np.float32)}
    with pytest.raises(InvalidArgument, match="'priority' is set by its own argument"):
        build_request("m", x, parameters={"priority": 1})
    with pytest.raises(InvalidArgument, match="priority must be >= 0"):
        build_request("m", x, priority=-1)
    with pytest.raises(InvalidArgument, match="datatypes names 'y'"):
        build_request("m", x, datatypes={"y": "FP32"})
    with pytest.raises(InvalidArgument, match="at least one input"):
        build_request("m", {})
    assert build_request("m", x, outputs="out").outputs == ("out",)
    assert build_request("m", x, queue_timeout=1e-9).parameters == {"timeout": 1}


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(404, NotFound), (413, PayloadTooLarge), (429, Unavailable), (431, InvalidArgument),
     (503, Unavailable), (504, DeadlineExceeded), (502, Internal)],
)  # fmt: skip
def test_http_statuses_map_to_errors(status: int, error_class: type[Exception]) -> None:
    error = from_http_status(status, "the server's words", 2.0)
    assert type(error) is error_class
    assert (error.message, error.status, error.retry_after) == ("the server's words", status, 2.0)


def test_grpc_codes_map_to_errors() -> None:
    assert type(from_grpc_code("UNAVAILABLE", "m")) is Unavailable
    assert type(from_grpc_code("RESOURCE_EXHAUSTED", "m")) is PayloadTooLarge
    assert type(from_grpc_code("DATA_LOSS", "m")) is Internal
    assert from_grpc_code("NOT_FOUND", "m").code == "NOT_FOUND"


def test_retry_after_is_seconds_or_a_date() -> None:
    assert retry_after({"retry-after": "3"}) == 3.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host:1", "grpc://host", "grpc://h:1/x"])
def test_urls_are_checked(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        Settings(
            url=url,
            tls=None,
            connect_timeout=1.0,
            max_backoff=1.0,
            token=None,
            headers={},
            binary_data=True,
        ).grpc_target()
