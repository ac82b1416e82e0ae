"""The numerical comparison and the random test inputs it runs on."""

import numpy as np
import pytest
from batchserve.export.errors import VerificationFailed
from batchserve.export.spec import ExportSpec, Tolerance, parse_input_spec
from batchserve.export.verify import (
    CaseResult,
    VerificationReport,
    check_report,
    compare,
    random_inputs,
)

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
