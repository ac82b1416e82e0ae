"""The numerical comparison and the random test inputs it runs on."""

from collections.abc import Mapping

import numpy as np
import pytest
from batchserve.export.comparison import (
    CaseResult,
    ScaledTolerance,
    VerificationReport,
    check_report,
    compare,
    compare_scaled,
)
from batchserve.export.errors import VerificationFailed
from batchserve.export.inputs import random_inputs
from batchserve.export.spec import ExportSpec, Tolerance, parse_input_spec
from batchserve.export.verify import verify_against

TOLERANCE = Tolerance(atol=1e-3, rtol=1e-2)


def test_within_atol_plus_rtol_times_expected_passes() -> None:
    expected = np.array([0.0, 100.0, -2.0], dtype=np.float32)
    got = expected + np.array([0.9e-3, 0.9, -0.9e-3], dtype=np.float32)

    check = compare("y", expected, got, TOLERANCE)

    assert check.passed
    assert check.max_abs == pytest.approx(0.9, rel=1e-5)
    assert check.max_rel == pytest.approx(0.009, rel=1e-4)


def test_one_element_outside_fails_and_is_counted() -> None:
    expected = np.zeros((2, 3), dtype=np.float32)
    got = expected.copy()
    got[1, 2] = 2e-3

    check = compare("y", expected, got, TOLERANCE)

    assert not check.passed
    assert (check.outside, check.total) == (1, 6)
    assert "(1/6 outside)" in str(check)


@pytest.mark.parametrize(
    ("expected", "got", "passed"),
    [
        ([np.nan, 1.0], [np.nan, 1.0], True),
        ([np.nan, 1.0], [0.0, 1.0], False),
        ([0.0, 1.0], [np.nan, 1.0], False),
        ([np.inf, -np.inf], [np.inf, -np.inf], True),
        ([np.inf, 1.0], [1e30, 1.0], False),
    ],
)
def test_nan_and_inf_must_match_exactly(
    expected: list[float], got: list[float], passed: bool
) -> None:
    check = compare("y", np.array(expected), np.array(got), TOLERANCE)

    assert check.passed is passed


@pytest.mark.parametrize(
    ("got", "problem"),
    [
        (np.zeros((2, 4), np.float32), "is float32[2, 4], PyTorch gives float32[2, 3]"),
        (np.zeros((2, 3), np.float64), "is float64[2, 3], PyTorch gives float32[2, 3]"),
    ],
)
def test_shape_or_dtype_mismatch_fails(got: np.ndarray, problem: str) -> None:
    check = compare("y", np.zeros((2, 3), np.float32), got, TOLERANCE)

    assert not check.passed
    assert check.problem == problem


def test_random_inputs_respect_ranges_bounded_by_an_axis() -> None:
    spec = ExportSpec(
        "m",
        (
            parse_input_spec("tokens:INT64:batch,seq:0..95"),
            parse_input_spec("lengths:INT32:batch,1:1..seq"),
            parse_input_spec("image:FP16:batch,2:-0.5..0.5"),
            parse_input_spec("mask:BOOL:batch,seq"),
        ),
        batch_sizes=(64,),
        axis_sizes={"seq": (3,)},
    )
    (case,) = spec.cases()

    arrays = random_inputs(spec, case, np.random.default_rng(0))

    assert arrays["tokens"].shape == (64, 3)
    assert arrays["tokens"].dtype == np.int64
    assert arrays["tokens"].min() >= 0
    assert arrays["tokens"].max() <= 95
    assert arrays["lengths"].dtype == np.int32
    assert set(np.unique(arrays["lengths"])) == {1, 2, 3}
    assert arrays["image"].dtype == np.float16
    assert np.abs(arrays["image"]).max() <= 0.5
    assert arrays["mask"].dtype == np.bool_
    again = random_inputs(spec, case, np.random.default_rng(0))
    assert all(np.array_equal(arrays[name], again[name]) for name in arrays)


def test_a_failed_case_raises_after_progress_sees_the_report() -> None:
    ok = compare("y", np.ones(2), np.ones(2), TOLERANCE)
    bad = compare("y", np.ones(2), np.zeros(2), TOLERANCE)
    report = VerificationReport(
        "ONNX Runtime",
        TOLERANCE,
        (CaseResult({"batch": 1}, (ok,)), CaseResult({"batch": 3}, (bad,))),
    )
    seen: list[VerificationReport] = []

    with pytest.raises(VerificationFailed, match="disagrees with PyTorch in 1 of 2 cases"):
        check_report(report, seen.append)

    assert seen == [report]
    assert report.max_abs == 1.0
    assert report.lines()[2] == "  batch=3: y max abs 1, max rel 1 (2/2 outside) [FAILED]"


def test_a_runtime_that_cannot_run_a_case_fails_it() -> None:
    case = CaseResult({"batch": 3}, (), "ONNX Runtime failed to run: bad shape")

    assert not case.passed
    assert str(case) == "batch=3: ONNX Runtime failed to run: bad shape [FAILED]"


# --- FP16 against FP32: errors judged against each output's range ---------------------------

FP16 = ScaledTolerance(fraction=1e-2, rtol=1e-2)
REFERENCE = "ONNX Runtime FP32 (CPU)"


def test_scaled_tolerance_allows_fp16_error_near_zero_that_an_element_bound_refuses() -> None:
    expected = np.array([100.0, 0.001, -50.0], np.float32)
    got = np.array([100.3, 0.2, -50.4], np.float32)  # 0.2 off near zero: 0.2% of the range

    scaled = compare_scaled("logits", expected, got, FP16, REFERENCE)
    elementwise = compare("logits", expected, got, Tolerance(atol=1e-2, rtol=1e-2))

    assert scaled.passed
    assert scaled.scale == pytest.approx(100.0)
    assert scaled.max_rel == pytest.approx(0.004, rel=1e-3)  # 0.4 of a range of 100
    assert not elementwise.passed


def test_error_beyond_the_scaled_bound_fails_naming_output_and_size() -> None:
    expected = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
    got = expected.copy()
    got[1, 2] += 0.1  # 5% of the range of 2; the bound there is 0.02 + 0.01 * |expected|

    check = compare_scaled("logits", expected, got, FP16, REFERENCE)

    assert not check.passed
    assert (check.outside, check.total) == (1, 12)
    assert str(check) == "logits max abs error 0.1 = 5% of its range 2 (1/12 outside)"


def test_fp16_overflow_fails_by_name() -> None:
    expected = np.array([[70000.0, 1.0], [2.0, 3.0]], np.float32)
    got = np.array([[np.inf, 1.0], [2.0, 3.0]], np.float32)

    check = compare_scaled("features", expected, got, FP16, REFERENCE)

    assert not check.passed
    assert str(check).startswith(
        "features overflows: 1 of 4 values are inf or NaN where ONNX Runtime FP32 (CPU) gives "
        "finite ones (largest |expected| 7e+04"
    )


@pytest.mark.parametrize(
    ("expected", "got", "passed"),
    [
        ([np.nan, 1.0], [np.nan, 1.0], True),
        ([np.inf, 1.0], [np.inf, 1.0], True),
        ([np.inf, 1.0], [-np.inf, 1.0], False),
        ([np.nan, 1.0], [0.0, 1.0], False),
    ],
)
def test_non_finite_reference_values_must_match_exactly(
    expected: list[float], got: list[float], passed: bool
) -> None:
    check = compare_scaled("y", np.array(expected), np.array(got), FP16, REFERENCE)

    assert check.passed is passed


def test_shape_mismatch_names_the_reference() -> None:
    check = compare_scaled("y", np.zeros((2, 3)), np.zeros((3, 2)), FP16, REFERENCE)

    assert check.problem == "is float64[3, 2], ONNX Runtime FP32 (CPU) gives float64[2, 3]"


WEIGHTS = np.random.default_rng(7).standard_normal((16, 10)).astype(np.float32)


def fp32_model(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"logits": np.tanh(inputs["x"] @ WEIGHTS) * 30.0}


def fp16_model(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same model computed in half precision, as an FP16 engine would."""
    x, w = inputs["x"].astype(np.float16), WEIGHTS.astype(np.float16)
    return {"logits": (np.tanh(x @ w) * np.float16(30.0)).astype(np.float32)}


def test_a_real_half_precision_model_passes_against_its_fp32_original() -> None:
    spec = ExportSpec("m", (parse_input_spec("x:FP32:batch,16"),), batch_sizes=(1, 3, 8))

    report = verify_against(
        fp32_model,
        fp16_model,
        spec,
        runtime="TensorRT FP16",
        reference_name=REFERENCE,
        tolerance=FP16,
    )

    assert report.passed, report.lines()
    assert len(report.cases) == 3
    assert 0 < report.max_abs < 0.3  # half precision does lose something
    assert report.lines()[0] == (
        "TensorRT FP16 vs ONNX Runtime FP32 (CPU), 3 cases, pass if "
        "|got - expected| <= 0.01 * range + 0.01 * |expected|"
    )


def test_an_fp16_model_off_by_more_than_its_range_allows_fails_the_export() -> None:
    spec = ExportSpec("m", (parse_input_spec("x:FP32:batch,16"),), batch_sizes=(2,))

    def drifting(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"logits": fp16_model(inputs)["logits"] + 1.5}  # 5% of a range of 30

    report = verify_against(
        fp32_model,
        drifting,
        spec,
        runtime="TensorRT FP16",
        reference_name=REFERENCE,
        tolerance=FP16,
    )

    with pytest.raises(VerificationFailed) as caught:
        check_report(report, None)
    message = str(caught.value)
    assert message.startswith(
        "TensorRT FP16 disagrees with ONNX Runtime FP32 (CPU) in 1 of 1 cases (first: batch=2: "
        "logits max abs error 1.5"
    )
    assert "% of its range" in message
