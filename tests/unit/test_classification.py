"""The classification extension as Triton's server answers it (src/classification.cc)."""

from typing import Any

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestedOutput, Tensor
from batchserve.dataplane.classification import (
    INLINE_BELOW,
    MAX_ELEMENTS,
    MAX_ENTRIES,
    classify,
    classify_outputs,
    requested_counts,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def tensor(values: Any, wire: str = "FP32", name: str = "prob") -> Tensor:
    array = np.asarray(values, dtype=BY_WIRE[wire].numpy)
    return Tensor(name, BY_WIRE[wire], array.shape, array)


def top(values: Any, k: int, *, wire: str = "FP32", batched: bool = False, **kw: Any) -> Any:
    result = classify(tensor(values, wire), k, kw.get("labels", ()), batched=batched)
    assert result.datatype.wire == "BYTES"
    assert result.data.shape == result.shape
    return result.data.tolist()


def test_entries_come_in_descending_order_with_six_decimals() -> None:
    assert top([0.1, 0.7, 0.2], 3) == [b"0.700000:1", b"0.200000:2", b"0.100000:0"]


def test_ties_keep_ascending_index_order() -> None:
    assert top([1, 3, 3, 1, 3], 5, wire="INT32") == [b"3:1", b"3:2", b"3:4", b"1:0", b"1:3"]
    assert top([0.0, -0.0, 0.5, 0.0], 4) == [
        b"0.500000:2",
        b"0.000000:0",
        b"-0.000000:1",
        b"0.000000:3",
    ]


def test_ties_past_sixteen_entries_still_keep_index_order() -> None:
    values = np.zeros(1000, dtype=np.float32)
    values[[5, 900]] = 2.0
    assert top(values, 4) == [b"2.000000:5", b"2.000000:900", b"0.000000:0", b"0.000000:1"]


def test_nan_sorts_last_and_keeps_its_sign_as_printf_writes_it() -> None:
    values = [np.nan, 1.0, -np.inf, -np.nan, np.inf]
    assert top(values, 5) == [b"inf:4", b"1.000000:1", b"-inf:2", b"nan:0", b"-nan:3"]


@pytest.mark.parametrize(
    ("value", "written"),
    [(1e-7, b"0.000000"), (5e-7, b"0.000000"), (2.5e-6, b"0.000003"),
     (1e20, b"100000000000000000000.000000"), (-1.5, b"-1.500000"),
     (123456.7890625, b"123456.789062")],
)  # fmt: skip
def test_fp64_values_are_written_as_std_to_string(value: float, written: bytes) -> None:
    assert top([value], 1, wire="FP64") == [written + b":0"]


def test_fp32_values_are_written_from_their_exact_value() -> None:
    assert top([0.1, 16777217.0], 2) == [b"16777216.000000:1", b"0.100000:0"]


@pytest.mark.parametrize(
    ("wire", "values", "expected"),
    [
        ("UINT8", [7, 255, 0], [b"255:1", b"7:0", b"0:2"]),
        ("INT8", [-128, 127, 0], [b"127:1", b"0:2", b"-128:0"]),
        ("UINT16", [1, 65535], [b"65535:1", b"1:0"]),
        ("INT16", [-32768, 5], [b"5:1", b"-32768:0"]),
        ("UINT32", [2**32 - 1, 2], [b"4294967295:0", b"2:1"]),
        ("INT32", [-(2**31), 2**31 - 1], [b"2147483647:1", b"-2147483648:0"]),
        ("UINT64", [2**64 - 1, 2**63], [b"18446744073709551615:0", b"9223372036854775808:1"]),
        ("INT64", [-(2**63), 2**63 - 1, 0],
         [b"9223372036854775807:1", b"0:2", b"-9223372036854775808:0"]),
    ],
)  # fmt: skip
def test_every_integer_type_is_ranked_and_written_in_full(
    wire: str, values: list[int], expected: list[bytes]
) -> None:
    assert top(values, len(values), wire=wire) == expected


def test_labels_are_appended_by_index_and_missing_or_empty_ones_omitted() -> None:
    labels = (b"cat", b"", b"dog")
    values = [0.1, 0.2, 0.3, 0.4]
    assert top(values, 4, labels=labels) == [
        b"0.400000:3",  # past the label count
        b"0.300000:2:dog",
        b"0.200000:1",  # an empty line is no label
        b"0.100000:0:cat",
    ]


def test_labels_may_hold_any_bytes_and_colons() -> None:
    assert top([1.0], 1, labels=(b"a:b \xff",)) == [b"1.000000:0:a:b \xff"]


def test_k_past_the_class_count_returns_every_class() -> None:
    result = classify(tensor([[1.0, 2.0]]), 10, (), batched=True)
    assert result.shape == (1, 2)
    assert result.data.tolist() == [[b"2.000000:1", b"1.000000:0"]]


def test_a_batching_model_keeps_its_batch_axis_and_flattens_the_rest() -> None:
    values = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    values[1] = -values[1]
    result = classify(tensor(values), 2, (), batched=True)
    assert result.shape == (2, 2)
    assert result.data.tolist() == [
        [b"5.000000:5", b"4.000000:4"],
        [b"-6.000000:0", b"-7.000000:1"],
    ]


def test_a_model_without_batching_ranks_the_whole_tensor() -> None:
    values = np.array([[1, 9], [8, 2]], dtype=np.int64)
    result = classify(tensor(values, "INT64"), 3, (), batched=False)
    assert result.shape == (3,)
    assert result.data.tolist() == [b"9:1", b"8:2", b"2:3"]


def test_a_batched_vector_has_one_class_per_sample() -> None:
    result = classify(tensor([3.0, 1.0, 2.0]), 5, (), batched=True)
    assert result.shape == (3, 1)
    assert result.data.tolist() == [[b"3.000000:0"], [b"1.000000:0"], [b"2.000000:0"]]


def test_a_sample_without_elements_gives_no_classes() -> None:
    result = classify(tensor(np.zeros((2, 0))), 3, (), batched=True)
    assert result.shape == (2, 0)


def test_more_elements_per_sample_than_triton_allows_is_refused() -> None:
    classify(tensor(np.zeros((2, MAX_ELEMENTS))), 1, (), batched=True)
    with pytest.raises(
        InvalidArgument,
        match=r"^classification output tensor too large: output 'prob' has 1000001 elements "
        r"per sample \(at most 1000000\)$",
    ):
        classify(tensor(np.zeros((1, MAX_ELEMENTS + 1))), 1, (), batched=True)


TYPES = {name: BY_WIRE[wire] for name, wire in [("f", "FP32"), ("h", "FP16"), ("s", "BYTES")]}


def test_requested_counts_names_the_classified_outputs_only() -> None:
    outputs = [RequestedOutput("f", classification=3), RequestedOutput("h")]
    assert requested_counts(outputs, TYPES) == {"f": 3}
    assert requested_counts(None, TYPES) == {}


@pytest.mark.parametrize(
    ("name", "wire"),
    [("h", "FP16"), ("s", "BYTES"), ("b", "BOOL"), ("bf", "BF16")],
)
def test_types_triton_cannot_classify_are_refused_in_its_words_first(name: str, wire: str) -> None:
    types = {name: BY_WIRE[wire]}
    with pytest.raises(
        InvalidArgument,
        match=rf"^class result not available for output due to unsupported type '{wire}': "
        rf"output '{name}' cannot be classified",
    ):
        requested_counts([RequestedOutput(name, classification=1)], types)


@pytest.mark.anyio
@pytest.mark.parametrize("width", [2, INLINE_BELOW])  # on the event loop, and in a thread
async def test_classify_outputs_replaces_only_the_classified_tensors(width: int) -> None:
    values = np.zeros((1, width), dtype=np.float32)
    values[0, 1] = 0.8
    plain, scores = tensor([1.0], name="plain"), tensor(values, name="scores")
    labels = {"scores": (b"no", b"yes")}
    done = await classify_outputs([plain, scores], {"scores": 1}, labels, batched=True)
    assert done[0] is plain
    assert (done[1].name, done[1].shape) == ("scores", (1, 1))
    assert done[1].data.tolist() == [[b"0.800000:1:yes"]]


def test_more_entries_than_batchserve_allows_are_refused_before_ranking() -> None:
    values = np.zeros((MAX_ENTRIES // 1000 + 1, 1000), dtype=np.float32)
    assert classify(tensor(values), 999, (), batched=True).shape == (1001, 999)
    with pytest.raises(
        InvalidArgument,
        match=r"^classification output tensor too large: output 'prob' would hold 1001000 "
        r"entries \(1001 samples x 1000 classes; at most 1000000\); ask for fewer classes$",
    ):
        classify(tensor(values), 1000, (), batched=True)


def reference(row: list[float], k: int) -> list[int]:
    """Descending, ties by ascending index, NaN last: the order documented, the slow way."""
    return sorted(range(len(row)), key=lambda i: (row[i] != row[i], -row[i], i))[:k]


@settings(max_examples=200, deadline=None)
@given(
    wire=st.sampled_from(["FP32", "FP64", "INT8", "UINT8", "INT64", "UINT64"]),
    width=st.integers(1, 200),
    k=st.integers(1, 40),
    data=st.data(),
)
def test_any_row_is_ranked_as_the_documented_order(
    wire: str, width: int, k: int, data: st.DataObject
) -> None:
    dtype = BY_WIRE[wire].numpy
    few = st.sampled_from([0, 1, 2, 7])  # few distinct values: many ties
    if dtype.kind == "f":
        values = few.map(float) | st.sampled_from([np.nan, -np.nan, np.inf, -np.inf, -0.0])
    else:
        info = np.iinfo(dtype)
        values = few | st.integers(int(info.min), int(info.max))
    rows = data.draw(hnp.arrays(dtype, (2, width), elements=values))
    got = classify(tensor(rows, wire), k, (), batched=True).data.tolist()
    indexes = [[int(entry.split(b":")[1]) for entry in sample] for sample in got]
    expected = [reference([float(v) for v in row], k) for row in rows.tolist()]
    if dtype.kind != "f":
        expected = [sorted(range(width), key=lambda i, r=r: (-r[i], i))[:k] for r in rows.tolist()]
    assert indexes == expected
