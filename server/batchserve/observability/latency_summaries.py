"""Triton's latency summaries (``--metrics-config summary_latencies=true``): quantiles of
the last minute, as prometheus-cpp's Summary keeps them, and the first-response histogram
(``histogram_latencies=true``).

prometheus-cpp keeps five estimators, reset in turn every 12 s, each thus seeing up to a
minute, and reads the quantiles from the one that has run longest. Here each 12-second
slice keeps a uniform sample (a reservoir) of at most ``SAMPLE`` observations and how many
it saw, and a quantile is read from the live slices' samples, each value weighted by its
slice's observations over its sample's size: memory stays bounded whatever the request
rate, and the quantile's error is the sample's. Count and sum are exact and cumulative, as
a summary's are. Only a server given the setting records into them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence

import numpy as np

from batchserve.observability.metrics import Buckets
from batchserve.proto.model_config_pb2 import ModelConfig

SLICE_NS = 12_000_000_000
SLICES = 5
SAMPLE = 1024
"""Observations kept per slice: 8 KiB per stage and slice, 200 KiB for a model version's
five stages."""
FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100, 500, 2000, 5000)
"""Triton's default buckets of ``nv_inference_first_response_histogram_ms``."""


class _Slice:
    __slots__ = ("filled", "number", "seen", "values")

    def __init__(self) -> None:
        self.number = -1
        self.seen = 0
        self.filled = 0
        self.values = np.empty(SAMPLE)

    def restart(self, number: int) -> None:
        self.number, self.seen, self.filled = number, 0, 0

    def add(self, value: float) -> None:
        self.seen += 1
        if self.filled < SAMPLE:
            self.values[self.filled] = value
            self.filled += 1
        elif (slot := random.randrange(self.seen)) < SAMPLE:
            self.values[slot] = value


class SlidingQuantiles:
    """One stage's observations: quantiles of the last minute, count and sum of all."""

    __slots__ = ("_clock", "_slices", "count", "total")

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._slices = [_Slice() for _ in range(SLICES)]
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` observations of ``value``."""
        self.count += count
        self.total += value * count
        number = self._clock() // SLICE_NS
        current = self._slices[number % SLICES]
        if current.number != number:
            current.restart(number)
        for _ in range(count):
            current.add(value)

    def quantiles(self, wanted: Sequence[float]) -> list[float]:
        """The ``wanted`` quantiles of the last minute; NaN with nothing observed in it, as
        prometheus-cpp writes an empty summary's."""
        now = self._clock() // SLICE_NS
        live = [s for s in self._slices if s.filled and now - s.number < SLICES]
        if not live:
            return [math.nan] * len(wanted)
        values = np.concatenate([s.values[: s.filled] for s in live])
        weights = np.concatenate([np.full(s.filled, s.seen / s.filled) for s in live])
        order = np.argsort(values, kind="stable")
        values, reached = values[order], np.cumsum(weights[order])
        last = len(values) - 1
        return [
            float(values[min(last, int(np.searchsorted(reached, q * reached[-1])))]) for q in wanted
        ]


class LatencySummaries:
    """The stages Triton summarizes, in nanoseconds: request, queue, compute input, infer
    and output; and a response cache's hits and misses, for a model that uses one."""

    __slots__ = (
        "cache_hit", "cache_miss", "compute_infer", "compute_input", "compute_output", "queue",
        "request",
    )  # fmt: skip

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.request = SlidingQuantiles(clock)
        self.queue = SlidingQuantiles(clock)
        self.compute_input = SlidingQuantiles(clock)
        self.compute_infer = SlidingQuantiles(clock)
        self.compute_output = SlidingQuantiles(clock)
        self.cache_hit = SlidingQuantiles(clock)
        self.cache_miss = SlidingQuantiles(clock)


def first_response_buckets(config: ModelConfig) -> Buckets:
    """The first-response histogram, in milliseconds: the buckets the model's config gives
    the family (``model_metrics { metric_control [...] }``, as Triton reads them), or
    Triton's."""
    bounds: tuple[float, ...] = FIRST_RESPONSE_BUCKETS_MS
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_FAMILY:
            bounds = tuple(sorted(control.histogram_options.buckets)) or bounds
    return Buckets(bounds)
