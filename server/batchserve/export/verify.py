"""Run PyTorch (or a reference runtime) and a converted model on the same random inputs, and
compare every element.

A case fails when an element is outside the tolerance, when NaN appears on one side only, when
a shape or dtype differs, or when the converted model cannot run at that size at all. Reduced
precision (an FP16 engine against the FP32 model) is judged against each output's range
(``ScaledTolerance``), and values the reference gives as finite but the converted model
overflows to infinity fail by name.

This module runs the cases; ``inputs`` draws their inputs, ``torch_model`` runs PyTorch and
``comparison`` judges each output and builds the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from batchserve.core.signature import DYNAMIC
from batchserve.export.comparison import (
    CaseResult,
    OutputCheck,
    ScaledTolerance,
    VerificationReport,
    compare,
    compare_scaled,
)
from batchserve.export.errors import first_line
from batchserve.export.inputs import SEED, Array, Arrays, random_inputs
from batchserve.export.spec import ExportSpec, Tolerance
from batchserve.export.torch_model import TorchModel

Runner = Callable[[Mapping[str, Array]], Mapping[str, Array]]
Judge = Callable[[str, Array, Array], OutputCheck]


def verify(
    model: TorchModel,
    spec: ExportSpec,
    runner: Runner,
    *,
    runtime: str,
    tolerance: Tolerance,
    declared: Mapping[str, tuple[int, ...]] | None = None,
) -> VerificationReport:
    """Compare ``runner`` with the model's framework (PyTorch, Keras) in every case (seeded).

    ``declared`` maps output names to the shapes the model file declares (-1 free); an output
    whose real shape contradicts its declaration fails, since config.pbtxt is built from it.
    """
    rng = np.random.default_rng(SEED)
    judge = partial(compare, tolerance=tolerance, reference=model.framework)
    check = _Check(model.run, runner, runtime, judge, declared or {})
    results = tuple(check.case(sizes, random_inputs(spec, sizes, rng)) for sizes in spec.cases())
    return VerificationReport(runtime, tolerance, results, model.framework)


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
