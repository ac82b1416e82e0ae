"""The ceiling: the model's own ONNX file in an in-process ONNX Runtime session.

CPU execution provider with default options (all graph optimisations, ORT's own thread count);
throughput is batch / median call time. The time budget of each batch size is spent in
ROUNDS rounds that cycle through the sizes: this machine's speed drifts by 10-35 % over
minutes, and measured one after another, the size that happened to fall in a fast minute
would set the "best" ceiling.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.inputs import ModelInputs
from bench.records import CeilingPoint

WARMUP_CALLS = 3
"""Untimed calls before a batch size's first round (one before each later round)."""
MIN_CALLS = 5
MAX_CALLS = 2000
ROUNDS = 3


def time_calls(
    session: Any,
    feeds: Mapping[str, object],
    budget_s: float,
    *,
    warmup: int = WARMUP_CALLS,
    min_calls: int = MIN_CALLS,
) -> list[float]:
    """Seconds of each timed ``session.run``: at least ``min_calls``, for ``budget_s``.

    ``session``: anything with ONNX Runtime's ``run(names, feeds)`` (the GPU check passes
    batchserve's backends through it).
    """
    for _ in range(warmup):
        session.run(None, feeds)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < MAX_CALLS and (len(times) < min_calls or time.perf_counter() < deadline):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return times


def measure(
    model_file: Path,
    inputs: ModelInputs,
    batches: Sequence[int],
    budget_s: float,
    rounds: int = ROUNDS,
) -> list[CeilingPoint]:
    """One point per batch size (batch 1 only for a model without a batch axis): the median
    of its calls over every round."""
    import onnxruntime  # here, so that the GPU check can time other runtimes without it

    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    sizes = tuple(batches) if inputs.batched else (1,)
    feeds = {batch: dict(inputs.feeds(batch)) for batch in sizes}
    times: dict[int, list[float]] = {batch: [] for batch in sizes}
    per_round = math.ceil(MIN_CALLS / rounds)
    for number in range(rounds):
        for batch in sizes:
            warmup = WARMUP_CALLS if number == 0 else 1
            times[batch] += time_calls(
                session, feeds[batch], budget_s / rounds, warmup=warmup, min_calls=per_round
            )
    return [
        CeilingPoint(inputs.model, batch, statistics.median(times[batch]), len(times[batch]))
        for batch in sizes
    ]
