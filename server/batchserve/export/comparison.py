"""Judging one output against the reference, and the report of every case.

``compare`` is element-wise within a ``Tolerance`` (NaN matches only NaN, infinities must
match exactly). ``compare_scaled`` judges a reduced-precision output against its range
(``ScaledTolerance``) and names the values it overflows to infinity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from batchserve.export.errors import VerificationFailed
from batchserve.export.inputs import Array
from batchserve.export.spec import Tolerance


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """How one output of one case compares with PyTorch."""

    name: str
    max_abs: float
    max_rel: float
    outside: int
    total: int
    problem: str = ""
    scale: float | None = None  # the output's range, when errors are judged against it

    @property
    def passed(self) -> bool:
        return not self.problem and self.outside == 0

    def __str__(self) -> str:
        if self.problem:
            return f"{self.name} {self.problem}"
        if self.scale is None:
            text = f"{self.name} max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"
        else:
            text = (
                f"{self.name} max abs error {self.max_abs:.3g} = {100 * self.max_rel:.3g}% of "
                f"its range {self.scale:.3g}"
            )
        return text if self.outside == 0 else f"{text} ({self.outside}/{self.total} outside)"


@dataclass(frozen=True, slots=True)
class ScaledTolerance:
    """An element passes when ``|got - expected| <= fraction * range + rtol * |expected|``.

    ``range`` is the largest finite ``|expected|`` of that output in that case: a reduced-
    precision model's error grows with the magnitudes it computes, not with each element.
    """

    fraction: float = 1e-2
    rtol: float = 1e-2

    def __post_init__(self) -> None:
        for label, value in (("fraction", self.fraction), ("rtol", self.rtol)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{label} must be a finite number >= 0, not {value}")

    def __str__(self) -> str:
        return f"|got - expected| <= {self.fraction:g} * range + {self.rtol:g} * |expected|"


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One set of sizes: every output's comparison, or why the converted model did not run."""

    sizes: Mapping[str, int]
    outputs: tuple[OutputCheck, ...]
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and all(check.passed for check in self.outputs)

    def __str__(self) -> str:
        where = " ".join(f"{axis}={size}" for axis, size in self.sizes.items()) or "fixed shapes"
        detail = self.error or "; ".join(str(check) for check in self.outputs)
        return f"{where}: {detail} [{'ok' if self.passed else 'FAILED'}]"


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """Every case of one runtime against PyTorch."""

    runtime: str
    tolerance: Tolerance | ScaledTolerance
    cases: tuple[CaseResult, ...]
    reference: str = "PyTorch"

    @property
    def passed(self) -> bool:
        return all(case.passed for case in self.cases)

    @property
    def max_abs(self) -> float:
        return max((c.max_abs for c in self._checks() if np.isfinite(c.max_abs)), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((c.max_rel for c in self._checks() if np.isfinite(c.max_rel)), default=0.0)

    def lines(self) -> list[str]:
        header = (
            f"{self.runtime} vs {self.reference}, {len(self.cases)} cases, pass if {self.tolerance}"
        )
        return [header, *(f"  {case}" for case in self.cases)]

    def _checks(self) -> list[OutputCheck]:
        return [check for case in self.cases for check in case.outputs]


def check_report(
    report: VerificationReport, progress: Callable[[VerificationReport], None] | None
) -> None:
    """Hand the report to ``progress``, then raise VerificationFailed if any case failed."""
    if progress is not None:
        progress(report)
    failed = [case for case in report.cases if not case.passed]
    if failed:
        raise VerificationFailed(
            f"{report.runtime} disagrees with {report.reference} in {len(failed)} of "
            f"{len(report.cases)} "
            f"cases (first: {failed[0]}); nothing was written"
        )


def compare(
    name: str, expected: Array, got: Array, tolerance: Tolerance, reference: str = "PyTorch"
) -> OutputCheck:
    """Element-wise comparison; NaN matches only NaN, and infinities must match exactly."""
    mismatch = _mismatch(name, expected, got, reference)
    if mismatch is not None:
        return mismatch
    e = expected.astype(np.float64)
    g = got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(g, e, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
    finite = np.isfinite(e) & np.isfinite(g)
    diff = np.abs(np.subtract(g, e, out=np.zeros_like(e), where=finite))
    scale = np.abs(e)
    rel = np.divide(diff, scale, out=np.zeros_like(e), where=finite & (scale > 0))
    outside = int(close.size - np.count_nonzero(close))
    return OutputCheck(name, _max(diff), _max(rel), outside, int(close.size))


def compare_scaled(
    name: str, expected: Array, got: Array, tolerance: ScaledTolerance, reference: str
) -> OutputCheck:
    """Compare a reduced-precision output with the full-precision one, against its range.

    Fails by name when the converted model gives inf or NaN where the reference is finite:
    FP16 tops out at 65504, and an activation above that is the usual way an FP16 engine
    breaks. ``max_rel`` is the largest error as a fraction of the range.
    """
    mismatch = _mismatch(name, expected, got, reference)
    if mismatch is not None:
        return mismatch
    e = expected.astype(np.float64)
    g = got.astype(np.float64)
    finite = np.isfinite(e)
    lost = finite & ~np.isfinite(g)
    if lost.any():
        largest = float(np.abs(e[lost]).max())
        problem = (
            f"overflows: {int(lost.sum())} of {e.size} values are inf or NaN where {reference} "
            f"gives finite ones (largest |expected| {largest:.3g}; FP16 tops out at 65504)"
        )
        return OutputCheck(name, np.inf, np.inf, int(lost.sum()), e.size, problem)
    scale = _max(np.abs(e[finite]))
    with np.errstate(invalid="ignore"):
        diff = np.abs(np.subtract(g, e, out=np.zeros_like(e), where=finite))
        limit = tolerance.fraction * scale + tolerance.rtol * np.abs(e)
        unmatched = ~finite & ~((e == g) | (np.isnan(e) & np.isnan(g)))
    outside = int(np.count_nonzero((diff > limit) & finite) + np.count_nonzero(unmatched))
    max_abs = _max(diff)
    return OutputCheck(name, max_abs, max_abs / scale if scale else 0.0, outside, e.size, "", scale)


def _mismatch(name: str, expected: Array, got: Array, reference: str) -> OutputCheck | None:
    if got.shape == expected.shape and got.dtype == expected.dtype:
        return None
    problem = (
        f"is {got.dtype}{list(got.shape)}, {reference} gives {expected.dtype}{list(expected.shape)}"
    )
    return OutputCheck(name, np.nan, np.nan, expected.size, expected.size, problem)


def _max(values: Array) -> float:
    return float(values.max()) if values.size else 0.0
