"""How far a runtime's outputs are from the FP32 eager module's on the same batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.gpu.records import Accuracy, Key

SIGNIFICANT = 0.01
"""Relative errors are taken over elements at least this share of the output's largest
magnitude: FP16 keeps 11 significant bits, so elements near zero differ by any ratio."""


def compare(
    key: Key,
    names: Sequence[str],
    got: Mapping[str, npt.NDArray[Any]],
    expected: Sequence[npt.NDArray[Any]],
) -> list[Accuracy]:
    """One figure per output, ``names`` and ``expected`` in the module's output order."""
    return [
        measure(key, name, np.asarray(got[name], np.float64), want.astype(np.float64))
        for name, want in zip(names, expected, strict=True)
    ]


def measure(
    key: Key, output: str, got: npt.NDArray[np.float64], want: npt.NDArray[np.float64]
) -> Accuracy:
    if got.shape != want.shape:
        raise ValueError(f"{key.label} {output}: shape {got.shape}, expected {want.shape}")
    error = np.abs(got - want)
    scale = np.abs(want)
    significant = scale >= SIGNIFICANT * float(scale.max(initial=0.0))
    relative = error[significant] / scale[significant] if significant.any() else error[:0]
    top1 = None
    if want.ndim == 2 and want.shape[1] > 1:
        top1 = float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
    return Accuracy(
        key,
        output,
        int(want.shape[0]),
        float(error.max(initial=0.0)),
        float(relative.max(initial=0.0)),
        top1,
    )
