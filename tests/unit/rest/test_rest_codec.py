import json
import re
import struct
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from batchserve.rest.codec import (
    decode_infer_request,
    encode_error,
    encode_infer_response,
    parse_header_length,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FP32, BYTES = BY_WIRE["FP32"], BY_WIRE["BYTES"]
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


def body_of(doc: dict[str, Any], *binary: bytes) -> tuple[bytes, int | None]:
    header = orjson.dumps(doc)
    return header + b"".join(binary), (len(header) if binary else None)


def decode(doc: dict[str, Any], *binary: bytes) -> InferRequest:
    body, header_length = body_of(doc, *binary)
    return decode_infer_request(body, header_length, "m", "1")


def fp32_input(name: str = "x", **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0], **extra}


def binary_input(name: str, size: int, shape: list[int] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "FP32",
        "shape": shape or [1, 2],
        "parameters": {"binary_data_size": size},
    }


def object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


# --- arrays tritonclient can send, per datatype ----------------------------------------------


@st.composite
def client_arrays(draw: st.DrawFn, binary: bool, finite: bool = True) -> tuple[str, np.ndarray]:
    """(wire datatype, array as tritonclient takes it) for every datatype ``binary`` allows."""
    wires = [w for w in BY_WIRE if binary or w != "BF16"]
    wire = draw(st.sampled_from(wires))
    shape = draw(SHAPES)
    if wire == "BYTES":
        count = int(np.prod(shape))
        items = st.binary(max_size=6) if binary else st.text(max_size=6).map(str.encode)
        return wire, object_array(draw(st.lists(items, min_size=count, max_size=count)), shape)
    if wire == "BF16":
        bits = draw(hnp.arrays(np.uint16, shape))
        return wire, bits.view(ml_dtypes.bfloat16)
    dtype = BY_WIRE[wire].numpy
    floats = hnp.from_dtype(dtype, allow_nan=not finite, allow_infinity=not finite)
    return wire, draw(hnp.arrays(dtype, shape, elements=floats if dtype.kind == "f" else None))


def same(got: np.ndarray, sent: np.ndarray, wire: str) -> bool:
    if wire == "BYTES":
        items = [x.encode() if isinstance(x, str) else x for x in got.ravel().tolist()]
        return bool(got.shape == sent.shape and items == sent.ravel().tolist())
    if wire == "BF16":  # compared as the float32 values they are the high halves of
        got, sent = (
            (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32) for a in (got, sent)
        )
    if got.dtype != sent.dtype or got.shape != sent.shape:
        return False
    if got.dtype.kind == "f":  # JSON's NaN carries no sign or payload bits, as in Triton
        nan = np.isnan(sent)
        return bool((np.isnan(got) == nan).all()) and got[~nan].tobytes() == sent[~nan].tobytes()
    return got.tobytes() == sent.tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=4), st.data())
def test_requests_built_by_tritonclient_decode_to_the_same_arrays(
    flags: list[tuple[bool, bool]], data: st.DataObject
) -> None:
    inputs, arrays = [], []
    for index, (binary, _) in enumerate(flags):
        wire, array = data.draw(client_arrays(binary))
        tensor = httpclient.InferInput(f"in{index}", list(array.shape), wire)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
        arrays.append((wire, array))
    outputs = [
        httpclient.InferRequestedOutput(f"out{index}", binary_data=binary)
        for index, (_, binary) in enumerate(flags)
    ]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="r1", priority=3, timeout=250
    )
    request = decode_infer_request(
        body,
        parse_header_length(None if header_length is None else str(header_length), len(body)),
        "m",
        "2",
    )
    assert (request.id, request.priority, request.timeout_us) == ("r1", 3, 250)
    assert [(o.name, o.binary) for o in request.outputs or ()] == [
        (f"out{i}", binary) for i, (_, binary) in enumerate(flags)
    ]
    for tensor, (wire, array) in zip(request.inputs, arrays, strict=True):
        assert tensor.datatype.wire == wire
        assert tensor.shape == array.shape
        assert same(tensor.data, array, wire)


def test_tritonclient_without_outputs_asks_for_binary_outputs() -> None:
    tensor = httpclient.InferInput("x", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32), binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    request = decode_infer_request(body, header_length, "m", "")
    assert request.outputs is None
    assert request.binary_output is True
    assert request.parameters == {}


def test_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    first = np.array([1.0, 2.0], dtype=np.float32).tobytes()
    second = np.array([3.0, 4.0], dtype=np.float32).tobytes()
    body, header_length = body_of(
        {"inputs": [binary_input("a", 8), binary_input("b", 8)]}, first, second
    )
    request = decode_infer_request(body, header_length, "m", "1")
    whole = np.frombuffer(body, dtype=np.uint8)
    assert all(np.shares_memory(tensor.data, whole) for tensor in request.inputs)
    assert request.inputs[1].data.tolist() == [[3.0, 4.0]]
    assert request.inputs[0].parameters == {"binary_data_size": 8}


def test_binary_and_json_inputs_mix_in_input_order() -> None:
    raw = np.array([5, 6], dtype=np.int64).tobytes()
    doc = {
        "inputs": [
            fp32_input("j"),
            {
                "name": "b",
                "datatype": "INT64",
                "shape": [2],
                "parameters": {"binary_data_size": 16},
            },
        ]
    }
    request = decode(doc, raw)
    assert [t.name for t in request.inputs] == ["j", "b"]
    assert request.inputs[1].data.tolist() == [5, 6]


def test_request_fields_are_decoded() -> None:
    request = decode(
        {
            "id": "abc",
            "parameters": {"priority": 1, "timeout": 10, "binary_data_output": True, "k": "v"},
            "inputs": [fp32_input()],
            "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}],
        }
    )
    assert request.model_name == "m"
    assert request.model_version == "1"
    assert (request.id, request.priority, request.timeout_us) == ("abc", 1, 10)
    assert request.binary_output is True
    assert request.parameters == {"k": "v"}
    assert request.outputs == [
        RequestedOutput("y", None),
        RequestedOutput("z", False, parameters={"binary_data": False}),
    ]


def test_classification_is_read_as_written_by_tritonclient() -> None:
    outputs = [
        httpclient.InferRequestedOutput("y", binary_data=False, class_count=3),
        httpclient.InferRequestedOutput("z"),
    ]
    doc = {"inputs": [fp32_input()], "outputs": [o._get_tensor() for o in outputs]}
    decoded = decode(doc).outputs
    assert decoded is not None
    assert [(o.name, o.binary, o.classification) for o in decoded] == [
        ("y", False, 3),
        ("z", True, 0),
    ]


def test_no_inputs_decode_for_validation_to_judge() -> None:
    """A model whose inputs are all optional takes a request with none (validation decides)."""
    assert decode({"inputs": []}).inputs == []


def test_empty_outputs_list_means_every_output() -> None:
    assert decode({"inputs": [fp32_input()], "outputs": []}).outputs is None


# --- malformed requests ----------------------------------------------------------------------


def raw_case(body: bytes, header_length: int | None, problem: str) -> Any:
    return pytest.param(body, header_length, problem, id=problem[:40])


def doc_case(doc: Any, problem: str, *binary: bytes) -> Any:
    body, header_length = body_of(doc, *binary) if isinstance(doc, dict) else (doc, None)
    return raw_case(body, header_length, problem)


F8 = b"\0" * 8
OVERFLOW = (
    "input 'x': shape .* causes total element count to exceed maximum size of 9223372036854775807"
)
"""Triton's words for a shape whose element count a signed 64-bit integer cannot hold."""


MALFORMED = [
    # row 3, 25: malformed JSON, non-UTF-8, invalid escapes
    doc_case(b'{"inputs":[', "malformed JSON: "),
    doc_case(b"", "malformed JSON: "),
    doc_case(b'{"inputs": "\xff"}', "malformed JSON: .*UTF-8"),
    doc_case(b'{"id": "\\uZZZZ"}', "malformed JSON: invalid escape"),
    doc_case(b'{"id": "\\ud800"}', "malformed JSON: .*surrogate"),
    # row 4: schema
    doc_case(b"[1, 2]", "the request must be a JSON object, got an array"),
    doc_case({}, "'inputs' must be an array, got null"),
    doc_case({"inputs": {"name": "x"}}, "'inputs' must be an array, got an object"),
    doc_case({"inputs": [5]}, r"inputs\[0\] must be an object, got 5"),
    doc_case({"inputs": [{"name": 3}]}, r"inputs\[0\]: 'name' must be a non-empty string, got 3"),
    doc_case({"inputs": [{"name": ""}]}, r"inputs\[0\]: 'name' must be a non-empty string"),
    doc_case({"inputs": [fp32_input(datatype=None)]}, "tensor 'x': 'datatype' must be a string"),
    doc_case({"inputs": [{"name": "x", "datatype": "FP32"}]}, "tensor 'x': 'shape' is missing"),
    doc_case(
        {"inputs": [fp32_input(shape="1,2")]}, "^Unable to parse 'shape': .*'1,2', not an array"
    ),
    doc_case(
        {"inputs": [fp32_input(parameters=[1])]}, "tensor 'x': 'parameters' must be an object"
    ),
    doc_case(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}, "tensor 'x': needs 'data'"
    ),
    doc_case({"inputs": [fp32_input()], "id": 5}, "request 'id' must be a string, got 5"),
    doc_case(
        {"inputs": [fp32_input()], "parameters": []}, "request: 'parameters' must be an object"
    ),
    doc_case(
        {"inputs": [fp32_input()], "outputs": {}}, "'outputs' must be an array, got an object"
    ),
    doc_case({"inputs": [fp32_input()], "outputs": ["y"]}, r"outputs\[0\] must be an object"),
    doc_case({"inputs": [fp32_input()], "outputs": [{"nam": "y"}]}, r"outputs\[0\]: 'name'"),
    doc_case(
        {"inputs": [fp32_input()], "outputs": [{"name": "y", "parameters": {"binary_data": 1}}]},
        "output 'y': parameter 'binary_data' must be true or false, got 1",
    ),
    # row 5: unknown datatype
    doc_case({"inputs": [fp32_input(datatype="FP33")]}, "tensor 'x': unknown datatype 'FP33'"),
    # row 7: duplicate names
    doc_case({"inputs": [fp32_input(), fp32_input()]}, "^input 'x' already exists in request"),
    doc_case(
        {"inputs": [fp32_input()], "outputs": [{"name": "y"}, {"name": "y"}]},
        "^output 'y' already exists in request",
    ),
    # rows 9, 10: dims, read as unsigned integers as Triton's HTTP front end reads them
    doc_case(
        {"inputs": [fp32_input(shape=[2, -5])]},
        r"^Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
        r"unsigned-integer \(batchserve: tensor 'x': shape dimension -5 is not an unsigned "
        r"integer\)$",
    ),
    doc_case(
        {"inputs": [fp32_input(shape=[2.5])]}, "unsigned-integer .*dimension 2.5 is not an unsigned"
    ),
    doc_case(
        {"inputs": [fp32_input(shape=[True])]},
        "unsigned-integer .*dimension true is not an unsigned",
    ),
    doc_case({"inputs": [fp32_input(shape=[16, 2**60 + 2])]}, f"invalid shape for {OVERFLOW}"),
    doc_case({"inputs": [fp32_input(shape=[4, 2**60 + 2])]}, "byte size overflow for input 'x'"),
    doc_case({"inputs": [fp32_input(shape=[1, 2**40])]}, "tensor 'x': shape dimension .* too"),
    doc_case({"inputs": [fp32_input(shape=[2**30, 2**30])]}, "tensor 'x': shape .* elements"),
    doc_case({"inputs": [binary_input("x", 0, [2**32, 2**32])]}, f"invalid shape for {OVERFLOW}"),
    # row 11: data count
    doc_case({"inputs": [fp32_input(shape=[1, 3])]}, "tensor 'x': data has 2 elements"),
    # row 12: nesting
    doc_case(
        {"inputs": [fp32_input(data=orjson.loads(b"[" * 101 + b"1.0" + b"]" * 101))]},
        r"^JSON nesting depth exceeds maximum allowed limit \(100\) \(batchserve: tensor 'x'",
    ),
    doc_case(b'{"inputs": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "malformed JSON: "),
    # row 14: binary_data_size past the body
    doc_case(
        {"inputs": [binary_input("x", 8), binary_input("y", 8)]}, "tensor 'y': .* runs past", F8
    ),
    # row 15: trailing bytes
    doc_case(
        {"inputs": [binary_input("x", 8)]}, "4 bytes of binary data are left over", F8 + b"abcd"
    ),
    doc_case({"inputs": [fp32_input()]}, "8 bytes of binary data are left over", F8),
    # row 16: size != shape x itemsize
    doc_case(
        {"inputs": [binary_input("x", 40, [1, 8])]},
        r"^input byte size mismatch for input 'x' for model 'm'\. Expected 32, got 40 "
        r"\(batchserve: "
        "shape",
        b"\0" * 40,
    ),
    # row 18: binary data without the header, or with header 0
    raw_case(
        orjson.dumps({"inputs": [binary_input("x", 8)]}) + F8,
        None,
        "malformed JSON: .*needs the Inference-Header-Content-Length header",
    ),
    raw_case(
        orjson.dumps({"inputs": [binary_input("x", 8)]}),
        None,
        "tensor 'x': binary_data_size is set but the request has no Inference-Header",
    ),
    raw_case(F8, 0, "Inference-Header-Content-Length is 0: a raw binary request has no JSON"),
    # row 19: data and binary_data_size together
    doc_case(
        {"inputs": [fp32_input(parameters={"binary_data_size": 8})]},
        "tensor 'x': has both 'data' and binary_data_size",
        F8,
    ),
    doc_case(
        {"inputs": [binary_input("x", -8)]}, "tensor 'x': binary_data_size must be an integer >= 0"
    ),
    doc_case(
        {"inputs": [binary_input("x", True)]}, "tensor 'x': binary_data_size must be an integer"
    ),
    # row 21: BYTES framing
    doc_case(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": 9},
                }
            ]
        },
        "string element 1 has length 5 for inference input 's' for model 'm', but only",
        struct.pack("<I", 0) + struct.pack("<I", 5) + b"a",
    ),
    doc_case(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 10},
                }
            ]
        },
        "^unexpected number of string elements .* for inference input 's'.*5 bytes left over",
        struct.pack("<I", 1) + b"a" + b"extra",
    ),
    # row 24: BF16 as JSON
    doc_case(
        {"inputs": [fp32_input(datatype="BF16")]},
        "^receiving BF16 data via JSON is not supported. .* for input x",
    ),
    doc_case({"inputs": [fp32_input(data=["1.0", 2.0])]}, "tensor 'x': FP32 data must be numbers"),
    # row 27: request parameters
    doc_case({"inputs": [fp32_input()], "parameters": {"priority": -1}}, "'priority' must be an"),
    doc_case({"inputs": [fp32_input()], "parameters": {"timeout": "x"}}, "'timeout' must be an"),
    doc_case({"inputs": [fp32_input()], "parameters": {"sequence_id": 3.5}}, "64-bit integer"),
    # row 28: too many tensors
    doc_case(
        {"inputs": [fp32_input()], "outputs": [{"name": f"o{i}"} for i in range(10_000)]},
        "request names 10000 outputs",
    ),
    doc_case({"inputs": [fp32_input(f"i{i}") for i in range(2000)]}, "request names 2000 inputs"),
    # extensions batchserve does not serve
    # shared memory: parameters checked as Triton's ParseSharedMemoryParams does
    doc_case(
        {"inputs": [fp32_input(parameters={"shared_memory_region": "r"})]},
        "tensor 'x': 'shared_memory_region' needs a 'shared_memory_byte_size' parameter",
    ),
    doc_case(
        {"inputs": [fp32_input(parameters={"shared_memory_offset": 0})]},
        "'shared_memory_offset' can not be specified without 'shared_memory_region'",
    ),
    doc_case(
        {
            "inputs": [
                fp32_input(parameters={"shared_memory_region": 3, "shared_memory_byte_size": 8})
            ]
        },
        "invalid value type for 'shared_memory_region' parameter for tensor 'x'",
    ),
    doc_case(
        {
            "inputs": [
                fp32_input(parameters={"shared_memory_region": "r", "shared_memory_byte_size": -1})
            ]
        },
        "invalid value for 'shared_memory_byte_size' parameter for tensor 'x'",
    ),
    doc_case(
        {
            "inputs": [
                fp32_input(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})
            ]
        },
        "tensor 'x': has both 'shared_memory_region' and data",
    ),
    doc_case(
        {
            "inputs": [fp32_input()],
            "outputs": [{"name": "y", "parameters": {"shared_memory_byte_size": 4}}],
        },
        "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
        "parameter for tensor 'y'",
    ),
    # the classification extension: k >= 1
    *(
        doc_case(
            {
                "inputs": [fp32_input()],
                "outputs": [{"name": "y", "parameters": {"classification": k}}],
            },
            f"invalid value for 'classification' parameter, expected >= 0: output 'y': .*{shown}",
        )
        for k, shown in ((0, "0"), (-3, "-3"), (2.5, "2.5"), ("2", "'2'"), (True, "true"))
    ),
]


@pytest.mark.parametrize(("body", "header_length", "problem"), MALFORMED)
def test_malformed_requests_are_invalid_arguments(
    body: bytes, header_length: int | None, problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        decode_infer_request(body, header_length, "m", "1")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc (batchserve: not a"),
        ("-1", "Unable to parse Inference-Header-Content-Length, got: -1 "),
        ("1.5", "Unable to parse Inference-Header-Content-Length, got: 1.5 "),
        ("", "Unable to parse Inference-Header-Content-Length, got:  "),
        ("\u0663", "Unable to parse Inference-Header-Content-Length, got: \u0663 "),  # not ASCII
        ("99999999999", "value is out of range [ -2147483648, 2147483647 ], got: 99999999999 "),
        ("9" * 5000, "value is out of range .*, got: 9{40} .batchserve: at most 2147483648"),
        ("101", "inference header size should be in range (0, 100), got: 101 (batchserve:"),
    ],
)
def test_bad_header_length_is_rejected_in_tritons_words(value: str, problem: str) -> None:
    pattern = problem if ".*" in problem or "{40}" in problem else re.escape(problem)
    with pytest.raises(InvalidArgument, match=pattern):
        parse_header_length(value, 100)


def test_header_length_is_parsed() -> None:
    assert parse_header_length(None, 10) is None
    assert parse_header_length("0", 10) == 0
    assert parse_header_length(" 10 ", 10) == 10


# --- responses -------------------------------------------------------------------------------


def response_of(*outputs: Tensor, **fields: Any) -> InferResponse:
    return InferResponse("m", "1", fields.pop("id", ""), list(outputs), **fields)


def fp32_output(name: str = "y") -> Tensor:
    return Tensor(name, FP32, (2, 2), np.arange(4, dtype=np.float32).reshape(2, 2) / 3)


def test_all_json_response_has_no_header_length() -> None:
    chunks, header_length = encode_infer_response(
        response_of(fp32_output(), id="r", parameters={"p": 1}), InferRequest("m")
    )
    assert header_length is None
    assert len(chunks) == 1
    doc = orjson.loads(chunks[0])
    data = doc["outputs"][0].pop("data")
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "id": "r",
        "parameters": {"p": 1},
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 2]}],
    }
    assert np.array_equal(np.float32(data), fp32_output().data.ravel())


def test_binary_choice_follows_the_request() -> None:
    request = InferRequest(
        "m", binary_output=True, outputs=[RequestedOutput("a", False), RequestedOutput("b", True)]
    )
    response = response_of(fp32_output("a"), fp32_output("b"))
    chunks, header_length = encode_infer_response(response, request)
    assert header_length == len(chunks[0])
    doc = orjson.loads(chunks[0])
    assert "data" in doc["outputs"][0]
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 16}
    assert bytes(chunks[1]) == fp32_output().data.tobytes()


def test_binary_data_output_is_the_default_only_when_no_output_is_listed() -> None:
    """Triton's rule (http_server.cc): a listed output without binary_data is JSON."""
    response = response_of(fp32_output("a"), fp32_output("b"))
    listed = InferRequest("m", binary_output=True, outputs=[RequestedOutput("a")])
    chunks, header_length = encode_infer_response(response_of(fp32_output("a")), listed)
    assert header_length is None
    assert "data" in orjson.loads(chunks[0])["outputs"][0]
    chunks, header_length = encode_infer_response(response, InferRequest("m", binary_output=True))
    doc = orjson.loads(chunks[0])
    assert [o["parameters"] for o in doc["outputs"]] == [{"binary_data_size": 16}] * 2


@pytest.mark.parametrize("wire", ["FP32", "BYTES"])
def test_an_empty_binary_output_adds_no_binary_data(wire: str) -> None:
    """As Triton (http_server.cc): an output's buffer goes in the body only when it has
    bytes, and a body with none is plain JSON (no Inference-Header-Content-Length)."""
    empty = Tensor("e", BY_WIRE[wire], (1, 0), np.zeros((1, 0), BY_WIRE[wire].numpy))
    request = InferRequest("m", binary_output=True)
    chunks, header_length = encode_infer_response(response_of(empty), request)
    assert (header_length, len(chunks)) == (None, 1)
    assert orjson.loads(chunks[0])["outputs"] == [
        {"name": "e", "datatype": wire, "shape": [1, 0], "parameters": {"binary_data_size": 0}}
    ]
    chunks, header_length = encode_infer_response(response_of(empty, fp32_output()), request)
    assert header_length == len(chunks[0])
    assert [bytes(chunk) for chunk in chunks[1:]] == [fp32_output().data.tobytes()]


def test_a_bf16_output_asked_for_as_json_refuses_the_answer_as_triton_does() -> None:
    bits = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16).view(np.uint16)
    response = response_of(Tensor("b", BY_WIRE["BF16"], (1, 2), bits))
    with pytest.raises(InvalidArgument, match=r"^sending BF16 data via JSON is not supported"):
        encode_infer_response(response, InferRequest("m"))
    chunks, header_length = encode_infer_response(response, InferRequest("m", binary_output=True))
    assert header_length == len(chunks[0])
    assert bytes(chunks[1]) == bits.tobytes()


def test_non_utf8_bytes_output_is_sent_as_binary_even_when_json_was_asked() -> None:
    data = object_array([b"\xff", b"ok"], (2,))
    chunks, header_length = encode_infer_response(
        response_of(Tensor("s", BYTES, (2,), data)), InferRequest("m")
    )
    assert header_length is not None
    body = b"".join(bytes(chunk) for chunk in chunks)
    result = httpclient.InferResult.from_response_body(body, header_length=header_length)
    assert result.as_numpy("s").tolist() == [b"\xff", b"ok"]


def test_nan_and_infinity_outputs_are_written_in_json_as_triton_writes_them() -> None:
    """NaN, Infinity and -Infinity, as Triton's JSON writer puts them (L0_nan_inf's raw
    HTTP test reads the body with Python's json); they used to be sent as binary data."""
    data = np.array([np.nan, np.inf, -np.inf, -1.5, 0.1], dtype=np.float32)
    chunks, header_length = encode_infer_response(
        response_of(Tensor("y", FP32, (5,), data)), InferRequest("m")
    )
    assert header_length is None
    assert len(chunks) == 1
    assert b'"data":[NaN,Infinity,-Infinity,-1.5,0.1]' in bytes(chunks[0])
    got = json.loads(bytes(chunks[0]))["outputs"][0]["data"]
    assert np.array_equal(np.array(got, np.float32), data, equal_nan=True)


@st.composite
def server_tensors(draw: st.DrawFn) -> tuple[Tensor, bool]:
    wire, array = draw(client_arrays(binary=True, finite=False))
    datatype: DataType = BY_WIRE[wire]
    data = array.view(np.uint16) if wire == "BF16" else array
    binary = wire == "BF16" or draw(st.booleans())  # as Triton, BF16 only as binary data
    return Tensor(f"o{draw(st.integers(0, 10**6))}", datatype, array.shape, data), binary


@settings(max_examples=60, deadline=None)
@given(st.lists(server_tensors(), min_size=1, max_size=4, unique_by=lambda t: t[0].name))
def test_responses_decode_in_tritonclient(cases: list[tuple[Tensor, bool]]) -> None:
    request = InferRequest("m", outputs=[RequestedOutput(t.name, b) for t, b in cases])
    chunks, header_length = encode_infer_response(response_of(*(t for t, _ in cases)), request)
    body = b"".join(bytes(chunk) for chunk in chunks)
    result = httpclient.InferResult.from_response_body(body, header_length=header_length)
    for tensor, _ in cases:
        got = result.as_numpy(tensor.name)
        if tensor.datatype.wire == "BF16":
            got = np.asarray(got, dtype=ml_dtypes.bfloat16).view(np.uint16)
        assert same(got, tensor.data, tensor.datatype.wire)


def test_encode_error() -> None:
    assert orjson.loads(encode_error("tensor 'x': bad \"shape\"")) == {
        "error": "tensor 'x': bad \"shape\""
    }


def test_outputs_in_shared_memory_carry_metadata_but_no_data() -> None:
    shared = Tensor("s", FP32, (1, 2), np.ones((1, 2), np.float32), {}, True)
    chunks, header_length = encode_infer_response(
        response_of(shared, fp32_output()), InferRequest("m", binary_output=True)
    )
    doc = orjson.loads(chunks[0])
    assert doc["outputs"][0] == {"name": "s", "datatype": "FP32", "shape": [1, 2]}
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 16}
    assert header_length == len(chunks[0])
    assert len(chunks) == 2  # the header and the one binary output
