"""Run PyTorch (or a reference runtime) and a converted model on the same random inputs, and
compare every element.

A case fails when an element is outside the tolerance, when NaN appears on one side only, when
a shape or dtype differs, or when the converted model cannot run at that size at all. Reduced
precision (an FP16 engine against the FP32 model) is judged against each output's range
(``ScaledTolerance``), and values the reference gives as finite but the converted model
overflows to infinity fail by name.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from batchserve.core.datatypes import from_numpy
from batchserve.core.errors import InvalidArgument
from batchserve.core.signature import DYNAMIC
from batchserve.export.errors import ExportError, VerificationFailed, first_line
from batchserve.export.spec import DEFAULT_INT_RANGE, ExportSpec, InputSpec, Tolerance

Array = npt.NDArray[Any]
Arrays = dict[str, Array]
Runner = Callable[[Mapping[str, Array]], Mapping[str, Array]]
SEED = 0
_OUTPUT_TYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
)


@dataclass(frozen=True, slots=True)
class TorchModel:
    """A module in eval mode with its inputs bound to forward's parameters by name.

    Args:
        module: the module.
        inputs: input names in forward's parameter order (passed positionally).
        outputs: names given to forward's outputs, in order.
    """

    module: torch.nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def arguments(self, arrays: Mapping[str, Array]) -> tuple[torch.Tensor, ...]:
        """Copies, so a forward that writes into its inputs cannot change the other side's data."""
        return tuple(torch.from_numpy(arrays[name].copy()) for name in self.inputs)

    def forward(self, arrays: Mapping[str, Array]) -> tuple[torch.Tensor, ...]:
        try:
            with torch.no_grad():
                result = self.module(*self.arguments(arrays))
        except Exception as exc:
            raise ExportError(
                f"{type(self.module).__name__}.forward failed on the declared inputs "
                f"{describe(arrays)}: {type(exc).__name__}: {exc}"
            ) from None
        return _flatten(self.module, result)

    def run(self, arrays: Mapping[str, Array]) -> Arrays:
        results = self.forward(arrays)
        pairs = zip(self.outputs, results, strict=True)
        return {name: tensor.detach().cpu().numpy() for name, tensor in pairs}


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


def bind_module(module: torch.nn.Module, spec: ExportSpec) -> TorchModel:
    """Put the module in eval mode, bind inputs by name, and name its outputs from a trial pass."""
    module.eval()
    probe = TorchModel(module, _forward_order(module, spec), ())
    results = probe.forward(trace_inputs(spec))
    names = _output_names(spec, len(results))
    _check_outputs(spec, names, results)
    return TorchModel(module, probe.inputs, names)


def trace_inputs(spec: ExportSpec) -> Arrays:
    """The inputs the module is traced with (the same on every call)."""
    return random_inputs(spec, spec.trace_case(), np.random.default_rng(SEED))


def random_inputs(spec: ExportSpec, sizes: Mapping[str, int], rng: np.random.Generator) -> Arrays:
    """Fresh random inputs for one case, within each input's declared value range."""
    return {item.name: _random_array(item, sizes, rng) for item in spec.inputs}


def verify(
    model: TorchModel,
    spec: ExportSpec,
    runner: Runner,
    *,
    runtime: str,
    tolerance: Tolerance,
    declared: Mapping[str, tuple[int, ...]] | None = None,
) -> VerificationReport:
    """Compare ``runner`` with PyTorch in every case of the spec (seeded, so reproducible).

    ``declared`` maps output names to the shapes the model file declares (-1 free); an output
    whose real shape contradicts its declaration fails, since config.pbtxt is built from it.
    """
    rng = np.random.default_rng(SEED)
    judge = partial(compare, tolerance=tolerance)
    check = _Check(model.run, runner, runtime, judge, declared or {})
    results = tuple(check.case(sizes, random_inputs(spec, sizes, rng)) for sizes in spec.cases())
    return VerificationReport(runtime, tolerance, results)


def verify_against(
    reference: Runner,
    runner: Runner,
    spec: ExportSpec,
    *,
    runtime: str,
    reference_name: str,
    tolerance: ScaledTolerance,
) -> VerificationReport:
    """Compare ``runner`` with another runtime's ``reference`` on the inputs ``verify`` uses.

    For a reduced-precision model against the full-precision one it was built from, so the
    comparison measures the precision lost, not the conversion (already verified).
    """
    rng = np.random.default_rng(SEED)
    judge = partial(compare_scaled, tolerance=tolerance, reference=reference_name)
    check = _Check(reference, runner, runtime, judge, {})
    results = tuple(check.case(sizes, random_inputs(spec, sizes, rng)) for sizes in spec.cases())
    return VerificationReport(runtime, tolerance, results, reference_name)


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


def describe(arrays: Mapping[str, Array]) -> str:
    """``tokens: INT64[3, 7], lengths: INT64[3, 1]``, for messages."""
    return ", ".join(f"{name}: {_wire(a)}{list(a.shape)}" for name, a in arrays.items())


Judge = Callable[[str, Array, Array], OutputCheck]


@dataclass(frozen=True, slots=True)
class _Check:
    expected: Runner
    runner: Runner
    runtime: str
    judge: Judge
    declared: Mapping[str, tuple[int, ...]]

    def case(self, sizes: Mapping[str, int], inputs: Arrays) -> CaseResult:
        expected = dict(self.expected(inputs))
        try:
            got = self.runner(inputs)
        except Exception as exc:  # the runtime cannot run this case: a verification failure
            return CaseResult(dict(sizes), (), f"{self.runtime} failed to run: {first_line(exc)}")
        return CaseResult(dict(sizes), tuple(self.output(n, expected[n], got) for n in expected))

    def output(self, name: str, expected: Array, got: Mapping[str, Array]) -> OutputCheck:
        if name not in got:
            return OutputCheck(name, np.nan, np.nan, expected.size, expected.size, "is missing")
        check = self.judge(name, np.asarray(expected), np.asarray(got[name]))
        declared = self.declared.get(name)
        if check.problem or declared is None or _conforms(declared, expected.shape):
            return check
        problem = f"has shape {list(expected.shape)} but the model file declares {list(declared)}"
        return OutputCheck(name, check.max_abs, check.max_rel, check.outside, check.total, problem)


def _conforms(declared: Sequence[int], shape: Sequence[int]) -> bool:
    if len(declared) != len(shape):
        return False
    return all(d in (DYNAMIC, s) for d, s in zip(declared, shape, strict=True))


def _max(values: Array) -> float:
    return float(values.max()) if values.size else 0.0


def _wire(array: Array) -> str:
    try:
        return from_numpy(array.dtype).wire
    except InvalidArgument:
        return str(array.dtype)


def _random_array(item: InputSpec, sizes: Mapping[str, int], rng: np.random.Generator) -> Array:
    shape = item.shape(sizes)
    dtype = item.datatype.numpy
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        low, high = item.value_range.bounds(sizes) if item.value_range else DEFAULT_INT_RANGE
        if high < low:
            raise ExportError(
                f"input '{item.name}': value range {item.value_range} is empty at {sizes}"
            )
        return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)
    if item.value_range:
        return rng.uniform(*item.value_range.bounds(sizes), size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _forward_order(module: torch.nn.Module, spec: ExportSpec) -> tuple[str, ...]:
    """Declared inputs in forward's parameter order, so ONNX input names match the right tensors."""
    declared = [item.name for item in spec.inputs]
    params = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
        return tuple(declared)
    positional = [
        name
        for name, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    call = f"{type(module).__name__}.forward({', '.join(positional)})"
    for name in declared:
        if name not in positional:
            raise ExportError(f"input '{name}' is not a parameter of {call}")
    order = positional[: len(declared)]
    missing = [name for name in order if name not in declared]
    if missing:
        raise ExportError(f"{call} takes '{missing[0]}' before the declared inputs; declare it too")
    return tuple(order)


def _flatten(module: torch.nn.Module, result: object) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    if (
        isinstance(result, tuple | list)
        and result
        and all(isinstance(t, torch.Tensor) for t in result)
    ):
        return tuple(result)
    raise ExportError(
        f"{type(module).__name__}.forward returned {type(result).__name__}; "
        "export needs a tensor or a tuple/list of tensors"
    )


def _output_names(spec: ExportSpec, count: int) -> tuple[str, ...]:
    if not spec.outputs:
        return tuple(f"output{i}" for i in range(count))
    if len(spec.outputs) != count:
        raise ExportError(
            f"forward returns {count} output(s) but {len(spec.outputs)} --output name(s) were "
            f"given ({', '.join(spec.outputs)})"
        )
    return spec.outputs


def _check_outputs(spec: ExportSpec, names: Sequence[str], results: Sequence[torch.Tensor]) -> None:
    batch = spec.trace_case()[spec.batch_axis] if spec.batch_axis else None
    for name, tensor in zip(names, results, strict=True):
        if tensor.dtype not in _OUTPUT_TYPES:
            raise ExportError(f"output '{name}' is {tensor.dtype}, which the server cannot send")
        if batch is not None and (tensor.dim() == 0 or tensor.shape[0] != batch):
            raise ExportError(
                f"output '{name}' has shape {list(tensor.shape)} for a batch of {batch}: with "
                "--max-batch-size > 0 every output's first axis must be the batch axis"
            )
