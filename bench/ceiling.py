"""The ceiling: the model's own ONNX file in an in-process ONNX Runtime session.

CPU execution provider with default options (all graph optimisations, ORT's own thread count),
a few warm-up calls, then calls for a time budget; throughput is batch / median call time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import onnxruntime

from bench.inputs import ModelInputs
from bench.records import CeilingPoint

WARMUP_CALLS = 3
MIN_CALLS = 5
MAX_CALLS = 2000


def time_calls(session: onnxruntime.InferenceSession, feeds: dict[str, object], budget_s: float
               ) -> tuple[float, int]:  # fmt: skip
    """Median seconds per ``session.run`` over at least MIN_CALLS calls and ``budget_s``."""
    for _ in range(WARMUP_CALLS):
        session.run(None, feeds)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < MAX_CALLS and (len(times) < MIN_CALLS or time.perf_counter() < deadline):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(times)


def measure(
    model_file: Path, inputs: ModelInputs, batches: Sequence[int], budget_s: float
) -> list[CeilingPoint]:
    """One point per batch size (batch 1 only for a model without a batch axis)."""
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    points = []
    for batch in batches if inputs.batched else (1,):
        median_s, calls = time_calls(session, dict(inputs.feeds(batch)), budget_s)
        points.append(CeilingPoint(inputs.model, batch, median_s, calls))
    return points
