import re
import struct
import time

import ml_dtypes
import numpy as np
import pytest
from batchserve.core import tensors
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import Internal, InvalidArgument
from batchserve.core.tensors import (
    MAX_ELEMENTS,
    MAX_TENSORS,
    array_from_bytes,
    array_to_bytes,
    checked_shape,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FP32, BYTES, BF16 = BY_WIRE["FP32"], BY_WIRE["BYTES"], BY_WIRE["BF16"]
NUMERIC = [dt for dt in BY_WIRE.values() if dt.wire != "BYTES"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


def packed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def numeric_arrays(datatype: DataType, *, finite: bool) -> st.SearchStrategy[np.ndarray]:
    elements = None
    if datatype.numpy.kind == "f":
        elements = hnp.from_dtype(datatype.numpy, allow_nan=not finite, allow_infinity=not finite)
    return hnp.arrays(datatype.numpy, SHAPES, elements=elements)


def object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def bytes_arrays(text: bool) -> st.SearchStrategy[np.ndarray]:
    """BYTES arrays of any shape; ``text`` keeps elements UTF-8 (representable in JSON)."""
    items = st.text(max_size=8).map(str.encode) if text else st.binary(max_size=8)

    def build(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        count = int(np.prod(shape))
        lists = st.lists(items, min_size=count, max_size=count)
        return lists.map(lambda xs: object_array(xs, shape))

    return SHAPES.flatmap(build)


# --- checked_shape -------------------------------------------------------------------------


def test_checked_shape_accepts_non_negative_ints() -> None:
    assert checked_shape([1, 0, 8], tensor="x") == (1, 0, 8)
    assert checked_shape([], tensor="x") == ()


@pytest.mark.parametrize(
    ("shape", "problem"),
    [
        ("1,8", "must be a list"),
        (None, "must be a list"),
        ({"a": 1}, "must be a list"),
        ([2, -5], "-5 is negative"),
        ([2.5], "2.5 is not an integer"),
        ([True], "true is not an integer"),
        (["8"], "'8' is not an integer"),
        ([[1]], "an array is not an integer"),
        ([1] * 65, "65 dimensions"),
        (
            [16, 2**60 + 2],
            "causes total element count to exceed maximum size of 9223372036854775807",
        ),
        ([2**31, 2], "4294967296 elements"),
        ([2**20, 2**20], "1099511627776 elements"),
        ([0, 2**40], "too large"),
    ],
)
def test_checked_shape_rejects(shape: object, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"'x'.*{problem}"):
        checked_shape(shape, tensor="x")


def test_counts_and_sizes_past_int64_get_tritons_texts() -> None:
    """Triton's HTTP front end words a shape whose element count, or byte size, a signed
    64-bit integer cannot hold (L0_http's test_buffer_size_overflow); below that, a shape
    over batchserve's own limit keeps batchserve's words."""
    fp32 = BY_WIRE["FP32"]
    with pytest.raises(InvalidArgument) as count:
        checked_shape([2**4, 2**60 + 2], tensor="INPUT0", datatype=fp32)
    assert str(count.value).startswith(
        "invalid shape for input 'INPUT0': shape [16, 1152921504606846978] causes total element "
        "count to exceed maximum size of 9223372036854775807 (batchserve: "
    )
    with pytest.raises(InvalidArgument) as size:
        checked_shape([2**2, 2**60 + 2], tensor="INPUT0", datatype=fp32)
    assert str(size.value).startswith(
        "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data "
        "type size (4) exceeds maximum allowed size (9223372036854775807) (batchserve: "
    )
    for datatype in (BY_WIRE["INT8"], BY_WIRE["BYTES"], None):  # fits in bytes, or no size
        with pytest.raises(InvalidArgument, match=r"shape dimension \d+ is too large"):
            checked_shape([2**2, 2**60 + 2], tensor="INPUT0", datatype=datatype)
    with pytest.raises(InvalidArgument, match="4611686018427387904 is too large"):
        checked_shape([2**62, 2**62, -5], tensor="INPUT0", datatype=fp32)  # not a count


def test_element_count_overflowing_int64_is_rejected_not_wrapped() -> None:
    # numpy.prod of this shape is 0 (wraps around); the check must not accept b"".
    assert int(np.prod([2**32, 2**32])) == 0
    with pytest.raises(InvalidArgument, match="elements"):
        checked_shape([2**30, 2**30, 2**30], tensor="x")


# --- binary ----------------------------------------------------------------------------------


def test_array_from_bytes_is_a_zero_copy_view() -> None:
    body = np.arange(8, dtype=np.float32).tobytes()
    array = array_from_bytes(memoryview(body)[0:32], FP32, (2, 4), tensor="x")
    assert array.shape == (2, 4)
    assert np.shares_memory(array, np.frombuffer(body, dtype=np.uint8))
    assert array[1, 3] == 7.0


def test_array_from_bytes_size_mismatch_message() -> None:
    with pytest.raises(InvalidArgument) as info:
        array_from_bytes(b"\0" * 40, FP32, (1, 8), tensor="x")
    assert info.value.message == (
        "input byte size mismatch for input 'x'. Expected 32, got 40 "
        "(batchserve: shape [1, 8] FP32 takes 32 bytes)"
    )


def test_array_from_bytes_bf16_is_a_uint16_view() -> None:
    values = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    array = array_from_bytes(values.tobytes(), BF16, (2,), tensor="x")
    assert array.dtype == np.uint16
    assert array.view(ml_dtypes.bfloat16).tolist() == [1.5, -2.0]


def test_bytes_elements_keep_empty_nul_and_non_utf8() -> None:
    array = array_from_bytes(packed(b"", b"a\x00b", b"\xff\xfe"), BYTES, (3, 1), tensor="s")
    assert array.shape == (3, 1)
    assert array.ravel().tolist() == [b"", b"a\x00b", b"\xff\xfe"]


@pytest.mark.parametrize(
    ("buf", "shape", "problem"),
    [
        (
            struct.pack("<I", 10) + b"abc",
            (1,),
            "string element 0 has length 10 for inference input 's', but only 3 bytes remain",
        ),
        (
            packed(b"a", b"b") + b"\x01\x00",
            (3,),
            "incomplete string length indicator for inference input 's', expecting 4 bytes but "
            "only 2 bytes available",
        ),
        (
            packed(b"a", b"bc", b"d"),
            (2,),
            "unexpected number of string elements 3 for inference input 's', expecting 2 "
            r"\(batchserve: 5 bytes left over",
        ),
        (
            packed(b"a") + b"xyz",
            (1,),
            "incomplete string length indicator for inference input 's', expecting 4 bytes but "
            "only 3 bytes available",
        ),
        (packed(b"a"), (2, 2), "expected 4 string elements for inference input 's', got 1 "),
        (
            b"",
            (MAX_ELEMENTS,),
            f"expected {MAX_ELEMENTS} string elements for inference input 's', got 0 ",
        ),
    ],
)
def test_bytes_elements_rejected_in_tritons_words(
    buf: bytes, shape: tuple[int, ...], problem: str
) -> None:
    """Triton core's ``ValidateBytesInputs``: a length prefix whole, then the shape's count."""
    with pytest.raises(InvalidArgument, match=rf"^{problem}"):
        array_from_bytes(buf, BYTES, shape, tensor="s")


def test_huge_bytes_shape_is_rejected_before_allocating() -> None:
    start = time.perf_counter()
    with pytest.raises(InvalidArgument):
        array_from_bytes(b"\0" * 64, BYTES, (MAX_ELEMENTS,), tensor="s")
    assert time.perf_counter() - start < 0.1


def test_array_to_bytes_of_large_contiguous_array_does_not_copy() -> None:
    array = np.arange(tensors.COPY_BELOW, dtype=np.int32).reshape(2, -1)
    raw = array_to_bytes(array, BY_WIRE["INT32"])
    assert isinstance(raw, memoryview)
    assert len(raw) == array.nbytes
    assert np.shares_memory(np.frombuffer(raw, dtype=np.int32), array)
    assert bytes(raw) == array.tobytes()


def test_array_to_bytes_of_small_array_is_a_copy() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert array_to_bytes(array, BY_WIRE["INT32"]) == array.tobytes()


def test_array_to_bytes_of_views_and_big_endian_is_row_major_little_endian() -> None:
    array = np.arange(6, dtype=">f4").reshape(2, 3).T
    raw = array_to_bytes(array, FP32)
    assert bytes(raw) == np.ascontiguousarray(array, dtype="<f4").tobytes()


def test_array_to_bytes_accepts_ml_dtypes_bfloat16() -> None:
    values = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    assert bytes(array_to_bytes(values, BF16)) == values.tobytes()


def test_array_to_bytes_refuses_a_dtype_that_is_not_the_datatype() -> None:
    with pytest.raises(Internal, match="tensor 'y': array of dtype float64 cannot be sent as FP32"):
        array_to_bytes(np.zeros(2), FP32, tensor="y")


def test_bytes_output_accepts_str_elements_as_utf8() -> None:
    # ONNX Runtime returns string outputs as object arrays of str.
    raw = array_to_bytes(np.array(["é", b"\xff"], dtype=object), BYTES)
    assert raw == packed("é".encode(), b"\xff")


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(NUMERIC).flatmap(
        lambda dt: st.tuples(st.just(dt), numeric_arrays(dt, finite=False))
    )
)
def test_numeric_bytes_round_trip(case: tuple[DataType, np.ndarray]) -> None:
    datatype, array = case
    raw = array_to_bytes(array, datatype)
    back = array_from_bytes(raw, datatype, array.shape, tensor="x")
    assert back.dtype == datatype.numpy
    assert back.tobytes() == array.tobytes()


@settings(max_examples=60, deadline=None)
@given(bytes_arrays(text=False))
def test_bytes_round_trip(array: np.ndarray) -> None:
    back = array_from_bytes(array_to_bytes(array, BYTES), BYTES, array.shape, tensor="s")
    assert back.shape == array.shape
    assert back.ravel().tolist() == array.ravel().tolist()


# --- request-level rules ---------------------------------------------------------------------


def test_tensor_count_and_duplicates() -> None:
    tensors.check_count(MAX_TENSORS, what="output")
    with pytest.raises(InvalidArgument, match="request names 1025 outputs"):
        tensors.check_count(MAX_TENSORS + 1, what="output")
    with pytest.raises(InvalidArgument, match=r"^input 'a' already exists in request"):
        tensors.check_unique(["a", "b", "a"], what="input")


def test_an_output_is_classified_or_placed_in_shared_memory_not_both() -> None:
    tensors.check_output_parameters({"classification": 3}, tensor="y")
    tensors.check_output_parameters({"shared_memory_region": "r"}, tensor="y")
    with pytest.raises(InvalidArgument, match=r"^Output can't set both 'shared_memory_region' and"):
        tensors.check_output_parameters(
            {"classification": 3, "shared_memory_region": "r"}, tensor="y"
        )


@pytest.mark.parametrize("k", [1, 1000, 2**64 - 1])
def test_class_count_takes_positive_integers(k: int) -> None:
    assert tensors.class_count(k, tensor="y") == k


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0, "0"), (-1, "-1"), (2**64, "18446744073709551616"), (True, "true"), (2.0, "2.0"),
     ("3", "'3'"), (None, "null")],
)  # fmt: skip
def test_class_count_refuses_the_rest_in_tritons_words_first(value: object, shown: str) -> None:
    expected = (
        r"^invalid value for 'classification' parameter, expected >= 0: output 'y': "
        rf"classification must be an integer >= 1, got {re.escape(shown)}$"
    )
    with pytest.raises(InvalidArgument, match=expected):
        tensors.class_count(value, tensor="y")
