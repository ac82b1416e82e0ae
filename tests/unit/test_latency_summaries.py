"""Triton's --metrics-config and the sliding-window latency summaries behind it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from batchserve.core.metrics_config import DEFAULT_QUANTILES, parse_metrics_config
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.latency_summaries import (
    SAMPLE,
    SLICE_NS,
    SlidingQuantiles,
    first_response_buckets,
)


def test_tritons_settings_are_read_and_the_defaults_are_tritons() -> None:
    default = parse_metrics_config([])
    assert (default.counter_latencies, default.summary_latencies, default.histogram_latencies) == (
        True,
        False,
        False,
    )
    assert default.summary_quantiles == DEFAULT_QUANTILES
    given = parse_metrics_config([
        "counter_latencies=false", "summary_latencies=true", "histogram_latencies=True",
        "summary_quantiles=0.5:0.05,0.99:0.001", "model_namespacing=true",
    ])  # fmt: skip
    assert (given.counter_latencies, given.summary_latencies, given.histogram_latencies) == (
        False,
        True,
        True,
    )
    assert given.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    assert given.unknown == ("model_namespacing",)  # Triton ignores it; the start-up log says


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("summary_latencies", "--metrics-config option format is <setting>=<value>. Got "),
        ("=true", "--metrics-config option format is <setting>=<value>. Got "),
        ("m,counter_latencies=false", "option format is <setting>=<value>"),
        ("counter_latencies=maybe", "expected true or false"),
        ("summary_quantiles=0.5", "invalid option [0.5]"),
        ("summary_quantiles=1.5:0.1", "invalid option [1.5:0.1]"),
        ("summary_quantiles=0.5:x", "invalid option [0.5:x]"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_metrics_config([entry])


def test_quantile_numbers_are_read_from_their_start_as_triton_reads_them() -> None:
    """Triton's std::stod reads a number's longest decimal start, and its L0_metrics starts
    the server with ``0.1:0.0.1``: batchserve starts too, reading the same, and says so."""
    given = parse_metrics_config(["summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:1e-2x"])
    assert given.summary_quantiles == ((0.1, 0.0), (0.7, 0.01), (0.75, 0.01))
    assert given.read_as == (
        "summary_quantiles: '0.0.1' read as 0.0, as Triton reads it",
        "summary_quantiles: '1e-2x' read as 0.01, as Triton reads it",
    )
    assert parse_metrics_config(["summary_quantiles=0.5:0.05"]).read_as == ()


class Clock:
    def __init__(self) -> None:
        self.now = 100 * SLICE_NS

    def __call__(self) -> int:
        return self.now


def test_quantiles_are_those_of_the_observations() -> None:
    clock = Clock()
    window = SlidingQuantiles(clock)
    values = np.random.default_rng(1).permutation(np.arange(1, 1001, dtype=float))
    for value in values:
        window.observe(value)
    got = window.quantiles([0.5, 0.9, 0.99])
    assert got == pytest.approx([500, 900, 990], abs=2)
    assert (window.count, window.total) == (1000, values.sum())


def test_a_slice_keeps_a_bounded_uniform_sample_and_weights_it_by_what_it_saw() -> None:
    clock = Clock()
    window = SlidingQuantiles(clock)
    for value in range(20 * SAMPLE):  # one slice: far more than its sample holds
        window.observe(float(value))
    assert window._slices[clock.now // SLICE_NS % 5].filled == SAMPLE
    clock.now += SLICE_NS  # a second slice of as many, all larger
    for value in range(20 * SAMPLE):
        window.observe(float(value + 20 * SAMPLE), count=1)
    median, high = window.quantiles([0.5, 0.99])
    assert median == pytest.approx(20 * SAMPLE, rel=0.1)  # both slices count equally
    assert high == pytest.approx(0.99 * 40 * SAMPLE, rel=0.05)


def test_observations_older_than_the_window_leave_it() -> None:
    clock = Clock()
    window = SlidingQuantiles(clock)
    window.observe(1000.0, count=3)
    clock.now += 4 * SLICE_NS
    window.observe(10.0)
    assert window.quantiles([0.5]) == [1000.0]  # 3 of 4 observations are still in it
    clock.now += SLICE_NS  # the first slice is a minute old: out
    assert window.quantiles([0.5]) == [10.0]
    clock.now += 5 * SLICE_NS
    assert math.isnan(window.quantiles([0.5])[0])  # nothing in the last minute
    assert window.count == 4  # count and sum are since the start


def test_the_first_response_buckets_are_the_models_own_or_tritons() -> None:
    assert first_response_buckets(parse_pbtxt('name: "m"')).bounds == (100, 500, 2000, 5000)
    config = parse_pbtxt("""name: "m"
    model_metrics { metric_control [{
      metric_identifier { family: "nv_inference_first_response_histogram_ms" }
      histogram_options { buckets: [8, 1, 2, 4] } }] }""")
    assert first_response_buckets(config).bounds == (1, 2, 4, 8)
