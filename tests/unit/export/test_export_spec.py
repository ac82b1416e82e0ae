"""SPEC strings and the ExportSpec they build: what is accepted, and what each error says."""

import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument
from batchserve.export.errors import ExportError
from batchserve.export.spec import (
    ExportSpec,
    InputSpec,
    ServingOptions,
    Tolerance,
    ValueRange,
    parse_axis_sizes,
    parse_input_spec,
    parse_sizes,
)
from batchserve.export.tensorrt import ProfileShapes, profile_shapes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x:FP32:batch,3,32,32", InputSpec("x", BY_WIRE["FP32"], ("batch", 3, 32, 32))),
        (
            "tokens:INT64:batch,seq:0..95",
            InputSpec("tokens", BY_WIRE["INT64"], ("batch", "seq"), ValueRange(0, 95)),
        ),
        (
            "lengths:int64:batch,1:1..seq",
            InputSpec("lengths", BY_WIRE["INT64"], ("batch", 1), ValueRange(1, "seq")),
        ),
        (
            "image:FP16:n,1,8,8:-0.5..16",
            InputSpec("image", BY_WIRE["FP16"], ("n", 1, 8, 8), ValueRange(-0.5, 16)),
        ),
        ("mask:BOOL:batch,seq", InputSpec("mask", BY_WIRE["BOOL"], ("batch", "seq"))),
    ],
)
def test_good_specs_parse(text: str, expected: InputSpec) -> None:
    assert parse_input_spec(text) == expected


def test_spec_round_trips_through_str() -> None:
    text = "lengths:INT64:batch,1:1..seq"
    assert str(parse_input_spec(text)) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x:FP32", "expected NAME:DTYPE:DIMS"),
        ("x:FP32:a:0..1:extra", "expected NAME:DTYPE:DIMS"),
        ("2x:FP32:batch", "input name '2x' must be a Python identifier"),
        ("x:FP33:batch", "unknown datatype 'FP33'"),
        ("x:BYTES:batch", "datatype BYTES cannot come from PyTorch"),
        ("x:FP32:", "DIMS is empty"),
        ("x:FP32:batch,-1", "dim '-1' is neither a positive size nor an axis name"),
        ("x:FP32:batch,0", "dim '0' is neither"),
        ("x:INT64:batch:5..1", "is empty (LOW > HIGH)"),
        ("x:INT64:batch:0.5..3", "range bound '0.5' is not an integer (INT64)"),
        ("x:INT8:batch:0..300", "range bound 300 does not fit INT8"),
        ("x:FP32:batch:0..seq", "range bound 'seq' is not a number"),
        ("x:FP32:batch:0..nan", "must be finite"),
        ("x:FP32:batch:a..1", "range bound 'a' is not a number"),
        ("x:INT64:batch:0-9", "must be LOW..HIGH"),
        ("m:BOOL:batch:0..1", "BOOL inputs take no value range"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match="--input") as error:
        parse_input_spec(text)
    assert message in error.value.message
    assert repr(text) in error.value.message


def test_sizes_and_axis_sizes_parse() -> None:
    assert parse_sizes("1, 3,8", option="--batch-sizes") == (1, 3, 8)
    assert parse_axis_sizes(["seq=1,7", "h=2"]) == {"seq": (1, 7), "h": (2,)}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["seq"], "expected AXIS=SIZE"),
        (["seq=1,x"], "'x' is not a positive integer"),
        (["seq=0"], "'0' is not a positive integer"),
        (["seq=1", "seq=2"], "axis 'seq' is given twice"),
    ],
)
def test_bad_axis_sizes(items: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_axis_sizes(items)


def _spec(*inputs: str, **kwargs: object) -> ExportSpec:
    return ExportSpec("m", tuple(parse_input_spec(text) for text in inputs), **kwargs)


def test_cases_cover_every_batch_and_axis_size() -> None:
    spec = _spec("tokens:INT64:batch,seq", "lengths:INT64:batch,1:1..seq", max_batch_size=4)
    assert spec.batch_axis == "batch"
    assert spec.dynamic_axes == ("seq",)
    assert spec.sizes_of("batch") == (1, 3, 4)  # 8 clipped to the max batch size
    assert len(spec.cases()) == 9
    assert {"batch": 3, "seq": 33} in spec.cases()
    assert spec.trace_case() == {"batch": 4, "seq": 33}


def test_no_batch_axis_and_no_dynamic_axes_is_one_case() -> None:
    spec = _spec("x:FP32:4,4", max_batch_size=0)
    assert spec.batch_axis is None
    assert spec.cases() == ({},)


@pytest.mark.parametrize(
    ("inputs", "kwargs", "message"),
    [
        (("x:FP32:3,32",), {}, "input 'x': the first axis must be the named batch axis"),
        (("x:FP32:b,3", "y:FP32:n,3"), {}, "inputs disagree on the batch axis name"),
        (("x:FP32:b,3", "x:FP32:b,4"), {}, "input 'x' is declared twice"),
        (("x:FP32:b,3",), {"outputs": ("x",)}, "also the name of an input"),
        (("x:FP32:b,s",), {"axis_sizes": {"t": (1,)}}, "--axis-sizes t: no input has that axis"),
        (("x:FP32:b,s",), {"axis_sizes": {"b": (1,)}}, "that is the batch axis"),
        (("x:INT64:b,1:1..seq",), {}, "range bound 'seq' names no axis"),
        (("x:FP32:b",), {"name": "../evil"}, "--name '../evil'"),
        (("x:FP32:b",), {"max_batch_size": -1}, "--max-batch-size must be >= 0"),
        (("x:FP32:b",), {"version": 0}, "--version must be >= 1"),
    ],
)
def test_invalid_export_specs(
    inputs: tuple[str, ...], kwargs: dict[str, object], message: str
) -> None:
    args = {"name": "m", **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        ExportSpec(inputs=tuple(parse_input_spec(t) for t in inputs), **args)


@pytest.mark.parametrize(
    ("serving", "max_batch_size", "message"),
    [
        (ServingOptions(preferred_batch_sizes=(4,)), 8, "need --dynamic-batching"),
        (ServingOptions(dynamic_batching=True), 0, "needs a batch axis"),
        (ServingOptions(True, preferred_batch_sizes=(16,)), 8, "16 is outside 1..8"),
        (ServingOptions(sequence_length_input="len"), 8, "'len' is not an input"),
        (ServingOptions(sequence_length_input="x"), 8, "must be an integer input of shape"),
    ],
)
def test_invalid_serving_options(
    serving: ServingOptions, max_batch_size: int, message: str
) -> None:
    inputs = ("x:FP32:b,seq", "lengths:INT64:b,1") if max_batch_size else ("x:FP32:1,seq",)
    with pytest.raises(InvalidArgument, match=message):
        _spec(*inputs, max_batch_size=max_batch_size, serving=serving)


def test_tolerance_rejects_negative_values() -> None:
    with pytest.raises(InvalidArgument, match="--atol must be a finite number >= 0"):
        Tolerance(atol=-1.0)


def test_tensorrt_profiles_follow_the_preferred_sizes_and_cover_tested_axis_sizes() -> None:
    spec = _spec(
        "tokens:INT64:batch,seq",
        "lengths:INT64:batch,1:1..seq",
        max_batch_size=32,
        batch_sizes=(1, 8, 32),
        axis_sizes={"seq": (5, 50, 20)},
        serving=ServingOptions(dynamic_batching=True, preferred_batch_sizes=(16, 4)),
    )
    # One profile per preferred size (tuned for it, taking the batches above the previous
    # one), and a last one up to max_batch_size.
    assert profile_shapes(spec) == (
        {
            "tokens": ProfileShapes((1, 5), (4, 50), (4, 50)),
            "lengths": ProfileShapes((1, 1), (4, 1), (4, 1)),
        },
        {
            "tokens": ProfileShapes((5, 5), (16, 50), (16, 50)),
            "lengths": ProfileShapes((5, 1), (16, 1), (16, 1)),
        },
        {
            "tokens": ProfileShapes((17, 5), (32, 50), (32, 50)),
            "lengths": ProfileShapes((17, 1), (32, 1), (32, 1)),
        },
    )


def test_explicit_profile_batch_sizes_replace_the_preferred_ones() -> None:
    spec = _spec(
        "image:FP32:batch,3",
        max_batch_size=8,
        batch_sizes=(3, 8),
        serving=ServingOptions(dynamic_batching=True, preferred_batch_sizes=(2,)),
    )
    shapes = profile_shapes(spec, (8, 4))
    assert [p["image"] for p in shapes] == [
        ProfileShapes((1, 3), (4, 3), (4, 3)),
        ProfileShapes((5, 3), (8, 3), (8, 3)),
    ]


def test_without_preferred_sizes_one_profile_is_tuned_for_the_max() -> None:
    spec = _spec("image:FP32:batch,3", max_batch_size=8)
    assert profile_shapes(spec) == ({"image": ProfileShapes((1, 3), (8, 3), (8, 3))},)


def test_profile_sizes_beyond_the_max_batch_or_without_a_batch_axis_are_refused() -> None:
    with pytest.raises(ExportError, match=r"batch sizes \[9\] are not within 1\.\.8"):
        profile_shapes(_spec("image:FP32:batch,3", max_batch_size=8), (4, 9))
    with pytest.raises(ExportError, match="needs a batch axis"):
        profile_shapes(_spec("image:FP32:2,3", max_batch_size=0), (1,))


def test_every_profile_must_hold_a_verified_batch_size() -> None:
    spec = _spec(
        "image:FP32:batch,3",
        max_batch_size=64,
        serving=ServingOptions(dynamic_batching=True, preferred_batch_sizes=(16,)),
    )  # tested at 1, 3, 8: nothing reaches the profile for 17..64
    with pytest.raises(
        ExportError,
        match=r"profile for batches 17\.\.64 would go unverified: no --batch-sizes value "
        r"\(1,3,8\) falls in it; add one, e.g\. --batch-sizes 1,3,8,64",
    ):
        profile_shapes(spec)
