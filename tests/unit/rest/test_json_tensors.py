"""The JSON ``data`` field of HTTP tensors: read flat or nested as Triton reads it, written
exactly, and refused in Triton's words."""

import math
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import InvalidArgument
from batchserve.rest.json_tensors import (
    JSON_OPTIONS,
    MAX_JSON_DEPTH,
    NotJsonRepresentable,
    array_from_json,
    array_to_json,
)
from batchserve.rest.json_text import MalformedJson, loads
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_tensors import NUMERIC, bytes_arrays, numeric_arrays

FP32, BYTES, BF16 = BY_WIRE["FP32"], BY_WIRE["BYTES"], BY_WIRE["BF16"]


def test_json_flat_and_nested_give_the_same_array() -> None:
    flat = array_from_json([1, 2, 3, 4, 5, 6], FP32, (2, 3), tensor="x")
    nested = array_from_json([[1, 2, 3], [4, 5, 6]], FP32, (2, 3), tensor="x")
    assert flat.dtype == np.float32
    assert np.array_equal(flat, nested)
    assert nested[1, 0] == 4.0


def test_json_bytes_are_utf8_encoded_strings() -> None:
    array = array_from_json(["", "a\x00b", "é"], BYTES, (3,), tensor="s")
    assert array.tolist() == [b"", b"a\x00b", "é".encode()]


def test_json_fp16_is_converted_from_numbers() -> None:
    array = array_from_json([0.5, 2], BY_WIRE["FP16"], (2,), tensor="h")
    assert array.dtype == np.float16
    assert array.tolist() == [0.5, 2.0]


def test_json_nesting_is_read_row_major_whatever_its_shape() -> None:
    # Triton reads any nesting depth-first and only counts the values (http_server.cc)
    assert array_from_json([[[[1.0]]]], FP32, (1, 1), tensor="x").tolist() == [[1.0]]
    ragged = array_from_json([[1, [2, 3]], [[[4]]], 5, 6], BY_WIRE["INT32"], (2, 3), tensor="x")
    assert ragged.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert array_from_json([[], [[1.0], []]], FP32, (1,), tensor="x").tolist() == [1.0]


def test_json_nesting_past_the_cap_is_refused_with_tritons_text() -> None:
    data: Any = [1.0]
    for _ in range(MAX_JSON_DEPTH):
        data = [data]
    with pytest.raises(InvalidArgument) as info:
        array_from_json(data, FP32, (1,), tensor="x")
    assert info.value.message.startswith(
        f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}) "
        "(batchserve: tensor 'x'"
    )
    assert array_from_json(data[0], FP32, (1,), tensor="x").tolist() == [1.0]


def test_json_nesting_is_capped_without_recursion() -> None:
    data: Any = [1.0]
    for _ in range(100_000):
        data = [data]
    with pytest.raises(InvalidArgument, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        array_from_json(data, FP32, (1,) * 64, tensor="x")


@pytest.mark.parametrize(
    ("data", "wire", "reading"),
    [
        (["1.5"], "FP32", "non-number as double"),
        ([1.5], "INT64", "non-signed-integer as signed-integer"),
        ([True], "UINT8", "non-unsigned-integer as unsigned-integer"),
        ([-1], "UINT16", "non-unsigned-integer as unsigned-integer"),
        ([-1], "UINT64", "non-unsigned-integer as unsigned-integer"),
        ([2**63], "INT64", "non-signed-integer as signed-integer"),
        ([-(2**63) - 1], "INT8", "non-signed-integer as signed-integer"),
        ([1], "BOOL", "non-boolean as boolean"),
        ([None], "BYTES", "non-string as string"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_as_tritons_json_reader_words_it(
    data: object, wire: str, reading: str
) -> None:
    with pytest.raises(InvalidArgument) as refusal:
        array_from_json(data, BY_WIRE[wire], (1,), tensor="x")
    assert str(refusal.value).startswith(
        f"Unable to parse 'data': attempt to access JSON {reading} (batchserve: tensor 'x': "
    )


@pytest.mark.parametrize(("value", "wire"), [(300, "UINT8"), (-129, "INT8"), (2**32, "INT32")])
def test_an_integer_a_64_bit_reader_takes_but_the_type_cannot_hold_keeps_our_range_text(
    value: int, wire: str
) -> None:
    with pytest.raises(InvalidArgument) as refusal:
        array_from_json([value], BY_WIRE[wire], (1,), tensor="x")
    assert str(refusal.value).startswith(f"tensor 'x': a value is out of range for {wire}")


@pytest.mark.parametrize(
    ("data", "wire", "shape", "problem"),
    [
        ("1.5", "FP32", (1,), "data must be an array, got '1.5'"),
        (1.5, "FP32", (1,), "data must be an array, got 1.5"),
        ([1.0, 2.0, 3.0], "FP32", (1, 2), r"data has 3 elements, shape \[1, 2\] needs 2"),
        ([[1.0], "2"], "FP32", (2,), "FP32 data must be numbers, got '2'"),
        (["1.5"], "FP32", (1,), "FP32 data must be numbers, got '1.5'"),
        ([True], "FP32", (1,), "FP32 data must be numbers, got true"),
        ([None], "FP64", (1,), "FP64 data must be numbers, got null"),
        ([{"a": 1}], "FP64", (1,), "got an object"),
        ([1.5], "INT64", (1,), "INT64 data must be integers, got 1.5"),
        ([False], "INT32", (1,), "INT32 data must be integers, got false"),
        ([1], "BOOL", (1,), "BOOL data must be true or false, got 1"),
        ([1], "BYTES", (1,), "BYTES data must be strings, got 1"),
        ([300], "INT8", (1,), "out of range for INT8"),
        ([-1], "UINT8", (1,), "out of range for UINT8"),
        ([2**64], "UINT64", (1,), "out of range for UINT64"),
        ([2**63], "INT64", (1,), "out of range for INT64"),
        ([1e300], "FP32", (1,), "out of range for FP32"),
        ([70000.0], "FP16", (1,), "out of range for FP16"),
    ],
)
def test_json_data_rejected(data: object, wire: str, shape: tuple[int, ...], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"tensor 'x': .*{problem}"):
        array_from_json(data, BY_WIRE[wire], shape, tensor="x")


@pytest.mark.parametrize(
    ("data", "wire", "shape"),
    [
        ([1.0, 2.0], "FP32", (1, 0)),
        ([["a"], "b"], "BYTES", (0,)),
        ("not even an array", "INT32", (2, 0, 3)),
        ([], "BOOL", (0,)),
        ([1.0], "BF16", (1, 0)),  # nor refused for its datatype
    ],
)
def test_json_data_of_a_tensor_with_no_elements_is_not_read(
    data: object, wire: str, shape: tuple[int, ...]
) -> None:
    """Triton (http_server.cc) appends an empty input when the shape has no elements and
    never reads ``data`` then, whatever it holds."""
    array = array_from_json(data, BY_WIRE[wire], shape, tensor="x")
    assert (array.shape, array.dtype) == (shape, BY_WIRE[wire].numpy)


def test_bf16_json_input_is_refused_in_tritons_words() -> None:
    with pytest.raises(InvalidArgument) as caught:
        array_from_json([1.0, 2.0], BF16, (1, 2), tensor="x")
    assert str(caught.value).startswith(
        "receiving BF16 data via JSON is not supported. Please use the binary data format "
        "for input x (batchserve: tensor 'x': "
    )


def test_json_output_of_bytes_is_strings() -> None:
    data = array_to_json(np.array([[b"a\x00"], ["b"]], dtype=object), BYTES)
    assert data == ["a\x00", "b"]


def test_json_output_of_non_utf8_bytes_is_refused() -> None:
    with pytest.raises(NotJsonRepresentable, match="tensor 'y': BYTES data is not UTF-8"):
        array_to_json(np.array([b"\xff"], dtype=object), BYTES, tensor="y")


@pytest.mark.parametrize("wire", ["FP16", "FP32", "FP64"])
def test_json_output_of_nan_or_infinity_is_written_as_triton_writes_it(wire: str) -> None:
    data = np.array([1.0, np.nan, -np.inf], dtype=BY_WIRE[wire].numpy)
    written = orjson.dumps({"data": array_to_json(data, BY_WIRE[wire], tensor="y")})
    assert written == b'{"data":[1.0,NaN,-Infinity]}'


@pytest.mark.parametrize(
    ("text", "values"),
    [
        (b'{"data":[NaN,Infinity,-Infinity,2.5]}', [math.nan, math.inf, -math.inf, 2.5]),
        (b'{"data":[[NaN],[1]], "name": "Infinity"}', [[math.nan], [1]]),
    ],
)
def test_json_text_reads_tritons_non_finite_numbers(text: bytes, values: list[Any]) -> None:
    """What Python's json.dumps (and so requests' json=) writes for NaN and infinity."""
    got = loads(text)["data"]
    assert np.array_equal(np.array(got, dtype=float), np.array(values, dtype=float), equal_nan=True)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'[NaN, "\\ud800"]', "surrogates not allowed"),
        (b"[NaN, 99999999999999999999999]", "exceeds 64-bit range"),
        (b"[" * 100_000 + b"NaN" + b"]" * 100_000, "depth limit exceeded"),
        (b"[NaNa]", "delimiter"),
        (b"[nan]", "invalid literal"),
        (b"[NaN" + b", 0" * (1 << 19) + b"]", "JSON bodies of up to 1 MiB; send a larger tensor"),
    ],
)
def test_json_text_refuses_what_orjson_refuses_besides_them(text: bytes, problem: str) -> None:
    with pytest.raises(MalformedJson, match=problem):
        loads(text)


@pytest.mark.parametrize("shape", [(2, 2), (1, 0)])
def test_json_output_of_bf16_is_refused_in_tritons_words(shape: tuple[int, ...]) -> None:
    """Not ``NotJsonRepresentable``: Triton refuses the request rather than switching the
    output to binary data, even an output with no elements."""
    bits = np.zeros(shape, dtype=ml_dtypes.bfloat16).view(np.uint16)
    with pytest.raises(InvalidArgument) as caught:
        array_to_json(bits, BF16, tensor="y")
    assert not isinstance(caught.value, NotJsonRepresentable)
    assert str(caught.value).startswith(
        "sending BF16 data via JSON is not supported. Please use the binary data format "
        "for output (batchserve: output 'y': "
    )


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from([dt for dt in NUMERIC if dt.wire != "BF16"]).flatmap(
        lambda dt: st.tuples(st.just(dt), numeric_arrays(dt, finite=True))
    )
)
def test_numeric_json_round_trip(case: tuple[DataType, np.ndarray]) -> None:
    datatype, array = case
    wire = orjson.dumps(array_to_json(array, datatype), option=JSON_OPTIONS)
    back = array_from_json(orjson.loads(wire), datatype, array.shape, tensor="x")
    assert back.dtype == datatype.numpy
    assert np.array_equal(back, array)


@settings(max_examples=60, deadline=None)
@given(bytes_arrays(text=True))
def test_bytes_json_round_trip(array: np.ndarray) -> None:
    wire = orjson.dumps(array_to_json(array, BYTES))
    back = array_from_json(orjson.loads(wire), BYTES, array.shape, tensor="s")
    assert back.ravel().tolist() == array.ravel().tolist()


def test_a_data_count_that_misses_the_shape_reads_in_tritons_words() -> None:
    fp32 = BY_WIRE["FP32"]
    with pytest.raises(InvalidArgument) as too_few:
        array_from_json([1.0] * 15, fp32, (1, 16), tensor="INPUT0")
    assert too_few.value.message.startswith(
        "Failed to parse 'data' field: shape does not match true shape (batchserve: tensor "
        "'INPUT0': data has 15 elements, shape [1, 16] needs 16)"
    )
    with pytest.raises(InvalidArgument) as too_many:
        array_from_json([1.0] * 18, fp32, (1, 16), tensor="INPUT0")
    assert too_many.value.message.startswith(
        "Unable to parse 'data': Shape does not match true shape of 'data' field (batchserve:"
    )
