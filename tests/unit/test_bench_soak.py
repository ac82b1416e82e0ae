"""The soak's verdict arithmetic, its answer checks, its request mix and its leaking backend."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.device import CPU

from bench import leaky_server, procstat
from bench.repo import completed_config, onnx_file
from bench.soak import ServerLog, Tally
from bench.soak_load import Case, Mix, mismatch
from bench.soak_stats import (
    MIB,
    RssSample,
    Window,
    alive_check,
    drift_check,
    latency_windows,
    log_check,
    memory_check,
    percentile,
    rss_allowance,
    rss_check,
    window_bounds,
)

DIGITS = Path(__file__).resolve().parents[2] / "model_repo" / "digits_cnn"


def test_rss_allowance_is_16_mib_for_small_servers_and_5_percent_for_large_ones() -> None:
    assert rss_allowance(100 * MIB) == 16 * MIB
    assert rss_allowance(320 * MIB) == 16 * MIB
    assert rss_allowance(1000 * MIB) == 50 * MIB


def test_rss_check_measures_from_the_first_sample_after_the_warm_up() -> None:
    samples = [RssSample(0, 100 * MIB), RssSample(5, 150 * MIB), RssSample(10, 160 * MIB),
               RssSample(20, 190 * MIB), RssSample(70, 170 * MIB)]  # fmt: skip
    check = rss_check(samples, warmup_end=10)
    assert (check.baseline.t, check.final.t) == (10, 70)
    assert check.growth == 10 * MIB
    assert check.peak == 190 * MIB
    assert check.slope_mib_per_min == pytest.approx(10.0)
    assert check.passed


def test_rss_growth_at_the_allowance_fails_and_just_under_passes() -> None:
    base = RssSample(10, 200 * MIB)
    assert not rss_check([base, RssSample(20, 216 * MIB)], 10).passed
    assert rss_check([base, RssSample(20, 216 * MIB - 1)], 10).passed
    assert not memory_check(rss_check([base, RssSample(20, 300 * MIB)], 10)).passed


def test_rss_check_needs_a_sample_after_the_warm_up() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        rss_check([RssSample(0, MIB), RssSample(5, MIB)], warmup_end=10)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7
    assert math.isnan(percentile([], 99))


def test_window_bounds_fold_a_short_tail_into_the_last_window() -> None:
    assert window_bounds(0, 90, 30) == [(0, 30), (30, 60), (60, 90)]
    assert window_bounds(0, 100, 30) == [(0, 30), (30, 60), (60, 100)]
    assert window_bounds(0, 110, 30) == [(0, 30), (30, 60), (60, 90), (90, 110)]
    assert window_bounds(10, 15, 30) == [(10, 15)]
    assert window_bounds(10, 10, 30) == []


def test_latency_windows_keep_the_warm_up_apart() -> None:
    latencies = [(t + 0.5, 0.001 * (t + 1)) for t in range(40)]  # one request per second
    windows = latency_windows(latencies, warmup_end=10, end=40, width=15)
    assert [(w.start, w.end, w.warmup) for w in windows] == [
        (0, 10, True), (10, 25, False), (25, 40, False)
    ]  # fmt: skip
    assert [w.count for w in windows] == [10, 15, 15]
    assert windows[1].p50 == pytest.approx(0.018)
    assert windows[2].p99 == pytest.approx(0.040)


def _windows(first_p99: float, last_p99: float) -> list[Window]:
    return [Window(0, 10, 100, 0.001, 1.0, warmup=True),
            Window(10, 20, 100, 0.001, first_p99, warmup=False),
            Window(20, 30, 0, math.nan, math.nan, warmup=False),
            Window(30, 40, 100, 0.001, last_p99, warmup=False)]  # fmt: skip


def test_p99_drift_fails_only_when_gross_in_ratio_and_in_time() -> None:
    assert drift_check(_windows(0.010, 0.025)).passed  # 2.5x
    assert drift_check(_windows(0.001, 0.005)).passed  # 5x but only 4 ms more
    gross = drift_check(_windows(0.010, 0.040))
    assert not gross.passed
    assert "4.00x" in gross.detail
    assert drift_check(_windows(0.040, 0.010)).passed  # faster at the end is fine
    assert drift_check(_windows(0.010, 0.040), limit=5).passed


def test_alive_check() -> None:
    assert alive_check(None, 0).passed
    assert not alive_check(None, 1).passed
    assert not alive_check(-9, None).passed
    assert not alive_check(None, 0, "connection refused").passed


def test_mismatch_names_the_output_that_differs() -> None:
    expected = {"y": np.array([[1.0, 2.0]], dtype=np.float32)}
    assert mismatch(expected, {"y": np.array([[1.0, 2.00001]], dtype=np.float32)}) is None
    assert "missing" in str(mismatch(expected, {}))
    assert "shape" in str(mismatch(expected, {"y": np.zeros((2, 2), dtype=np.float32)}))
    assert "differs" in str(mismatch(expected, {"y": np.array([[1.0, 2.5]], dtype=np.float32)}))


async def _never_sent(clients: object, rng: random.Random) -> str | None:
    raise AssertionError("not sent in this test")


def test_mix_sends_the_asked_share_of_bad_requests() -> None:
    good = tuple(Case(f"g{i}", True, _never_sent) for i in range(6))
    bad = tuple(Case(f"b{i}", False, _never_sent) for i in range(11))
    mix = Mix(good, bad, bad_fraction=0.1)
    rng = random.Random(0)
    picks = [mix.pick(rng) for _ in range(20_000)]
    share = sum(not c.good for c in picks) / len(picks)
    assert share == pytest.approx(0.1, abs=0.01)
    assert {c.name for c in picks} == {c.name for c in mix.cases}


def test_tally_keeps_good_latencies_and_the_first_errors() -> None:
    tally = Tally()
    tally.record("good", True, 1.0, 0.002, None)
    tally.record("bad", False, 1.5, 0.001, None)
    for i in range(5):
        tally.record("good", True, 2.0, 0.003, f"wrong {i}")
    assert tally.latencies == [(1.0, 0.002)]
    assert tally.sent == {"good": 6, "bad": 1}
    assert tally.unexpected == {"good": 5}
    assert tally.messages["good"] == ["wrong 0", "wrong 1", "wrong 2"]


def test_leaky_backend_answers_as_the_real_one_and_keeps_bytes_per_batch() -> None:
    config = completed_config(DIGITS)
    create = leaky_server.leaky_factory("digits_cnn", leak_bytes=4096)
    backend = create(config, onnx_file(DIGITS))
    plain = leaky_server.create_backend(config, onnx_file(DIGITS))
    assert isinstance(backend, leaky_server.LeakyBackend)
    for b in (backend, plain):
        b.load(onnx_file(DIGITS), config, CPU)
    image = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    before = len(leaky_server.RETAINED)
    got = backend.infer({"image": image})
    assert len(leaky_server.RETAINED) == before + 1
    assert len(leaky_server.RETAINED[-1]) == 4096
    np.testing.assert_array_equal(got["logits"], plain.infer({"image": image})["logits"])
    backend.unload()
    plain.unload()
    leaky_server.RETAINED.clear()


def test_leaky_factory_leaves_other_models_alone() -> None:
    config = completed_config(DIGITS)
    backend = leaky_server.leaky_factory("char_lstm", 4096)(config, onnx_file(DIGITS))
    assert not isinstance(backend, leaky_server.LeakyBackend)


def test_rss_is_read_from_proc_status() -> None:
    status = "Name:\tpython\nVmPeak:\t  500 kB\nVmRSS:\t  2048 kB\nThreads:\t4\n"
    assert procstat.parse_rss(status) == 2 * MIB
    with pytest.raises(ValueError, match="VmRSS"):
        procstat.parse_rss("Name:\tzombie\nState:\tZ (zombie)\n")
    assert procstat.rss_bytes(os.getpid()) > MIB


def test_server_log_counts_levels_and_quotes_the_first_errors() -> None:
    log = ServerLog()
    log('{"level": "INFO", "message": "model ready"}\n')
    log('{"level": "ERROR", "message": "boom", "exc_info": "Traceback\\n  ...\\nKeyError: x"}\n')
    log("a line that is not JSON\n")
    assert log.levels == {"INFO": 1, "ERROR": 1, "UNPARSED": 1}
    assert log.errors == ["boom: KeyError: x"]
    check = log_check(log.error_count, log.errors)
    assert not check.passed
    assert "boom" in check.detail
    assert log_check(0, []).passed
