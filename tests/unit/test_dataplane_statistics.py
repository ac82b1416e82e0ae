"""Triton's model statistics, built once from the live counters; both adapters render them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from batchserve.core.device import CPU, Device
from batchserve.core.errors import Overloaded
from batchserve.dataplane.statistics import (
    InferBatchStatistics,
    InstanceMemory,
    MemoryUsage,
    StatisticDuration,
    model_statistics,
)
from batchserve.grpc import messages
from batchserve.models.measured_defaults import Setting, Trial, Tuning
from batchserve.models.memory_probe import MemoryProfile
from batchserve.models.model_table import InstanceMemory as MeasuredMemory
from batchserve.models.model_table import ServedVersion
from batchserve.observability.stats import Duration, ModelStats
from batchserve.rest import responses

MEMORY = (
    MeasuredMemory(Device("gpu", 1), MemoryProfile(1000, 20), 5000, 7),
    MeasuredMemory(CPU, MemoryProfile(3, 4), 600, 9, batch_steps=1152),
)


def _served(
    name: str = "m", version: int = 2, tuning: Tuning | None = None, positions: bool = False
) -> ServedVersion:
    stats = ModelStats()
    stats.record_batch(4, 10, 200, 30)
    stats.record_compute(3, 10, 200, 30)  # the batch of 4 answered three requests
    stats.record_batch(2, 11, 210, 31)
    stats.record_compute(1, 11, 210, 31)
    stats.record_batch(4, 12, 220, 32)
    stats.record_compute(2, 12, 220, 32)
    stats.record_request(True, 1000, 100)
    stats.record_request(False, 500, 0)
    stats.last_inference_ms = 1_700_000_000_000
    routing = SimpleNamespace(cpu_below=(40_000 if positions else 5) if tuning else 0)
    policy = SimpleNamespace(max_batch_steps=1024)
    batcher = SimpleNamespace(cap=8, routing=routing, policy=policy, counts_positions=positions)
    served = SimpleNamespace(
        name=name, version=version, stats=stats, batcher=batcher, memory=MEMORY, tuning=tuning
    )
    return cast(ServedVersion, served)


def test_statistics_are_the_counters_in_tritons_shape() -> None:
    (row,) = model_statistics([_served()])
    assert (row.name, row.version, row.last_inference) == ("m", "2", 1_700_000_000_000)
    assert (row.inference_count, row.execution_count) == (10, 3)
    stats = row.inference_stats
    assert (stats.success, stats.fail) == (StatisticDuration(1, 1000), StatisticDuration(1, 500))
    assert stats.queue == StatisticDuration(1, 100)
    # Triton's definition: per request answered, each adding the compute of its batch;
    # per execution in batch_stats
    assert stats.compute_infer == StatisticDuration(6, 3 * 200 + 210 + 2 * 220)
    assert stats.compute_input == StatisticDuration(6, 3 * 10 + 11 + 2 * 12)
    assert stats.compute_output == StatisticDuration(6, 3 * 30 + 31 + 2 * 32)
    assert row.batch_stats == (  # by batch size, as Triton lists them
        InferBatchStatistics(
            2, StatisticDuration(1, 11), StatisticDuration(1, 210), StatisticDuration(1, 31)
        ),
        InferBatchStatistics(
            4, StatisticDuration(2, 22), StatisticDuration(2, 420), StatisticDuration(2, 62)
        ),
    )
    # each request's one response is response 0: its batch's compute and output time
    ((index, response),) = row.response_stats
    assert index == "0"
    assert response.compute_infer == StatisticDuration(6, 3 * 200 + 210 + 2 * 220)
    assert response.compute_output == StatisticDuration(6, 3 * 30 + 31 + 2 * 32)
    assert response.success == StatisticDuration(6, 3 * 230 + 241 + 2 * 252)
    assert response.fail == response.empty_response == response.cancel == StatisticDuration(0, 0)
    assert row.memory_usage == (MemoryUsage("GPU", 1, 5000), MemoryUsage("CPU", 0, 600))
    assert (row.batch_cap, row.batch_steps) == (8, 1024)
    assert row.instances == (
        InstanceMemory("gpu:1", 1000, 20, 5000, 7),
        InstanceMemory("cpu", 3, 4, 600, 9, batch_steps=1152),
    )


def test_statistics_are_a_snapshot_of_the_counters() -> None:
    served = _served()
    (before,) = model_statistics([served])
    served.stats.record_batch(8, 1, 1, 1)
    served.stats.record_request(True, 1, 1)
    assert before.inference_count == 10
    assert before.inference_stats.success.count == 1
    assert [b.batch_size for b in before.batch_stats] == [2, 4]


def test_a_group_recorded_once_counts_as_its_members_one_by_one() -> None:
    """A worker's group of requests shares every timing: one call with ``count`` must leave
    the counters, histograms and objective tallies as ``count`` calls would."""
    one_by_one, grouped = ModelStats(), ModelStats()
    for stats in (one_by_one, grouped):
        stats.latency_objective_ns = 1500
    for _ in range(3):
        one_by_one.record_request(True, 1000, 100, protocol="grpc")
        one_by_one.record_request(True, 2000, 300, protocol="grpc")
        one_by_one.record_request(False, 500, 0, Overloaded("full"), "http")
    grouped.record_request(True, 1000, 100, protocol="grpc", count=3)
    grouped.record_request(True, 2000, 300, protocol="grpc", count=3)
    grouped.record_request(False, 500, 0, Overloaded("full"), "http", count=3)
    assert grouped.success == one_by_one.success == Duration(6, 9000)
    assert grouped.queue == one_by_one.queue == Duration(6, 1200)
    assert grouped.fail == one_by_one.fail == Duration(3, 1500)
    assert grouped.outcomes == one_by_one.outcomes == {("grpc", True): 6, ("http", False): 3}
    assert grouped.rejections == one_by_one.rejections
    assert sum(grouped.rejections.values()) == 3
    assert (grouped.objective_met, grouped.objective_missed) == (3, 3)
    assert (one_by_one.objective_met, one_by_one.objective_missed) == (3, 3)
    for name in ("request", "queue"):
        mine, theirs = getattr(grouped.observed, name), getattr(one_by_one.observed, name)
        assert mine.counts == theirs.counts
        assert mine.total == theirs.total
    assert grouped.observed.request.count == 6


TUNING = Tuning(
    Setting(2, 1),
    "measured 1.40x the default's throughput",
    (Trial(Setting(), (100.0, 110.0, 90.0)), Trial(Setting(2, 1), (140.0,)),
     Trial(Setting(2, cuda_graphs=True), (), "cannot capture")),
    1.5,
)  # fmt: skip


def test_measured_defaults_and_the_device_split_are_in_the_statistics() -> None:
    (plain, measured) = model_statistics([_served("a", 1), _served("b", 1, TUNING)])
    assert (plain.measured_defaults, plain.cpu_below_batch_size) == (None, 0)
    assert (measured.measured_defaults, measured.cpu_below_batch_size) == (TUNING, 5)
    (http,) = responses.statistics([measured])["model_stats"]
    assert http["batchserve"]["measured_defaults"] == {
        "chosen": {"instances": 2, "threads": 1, "cuda_graphs": False, "cpu_instances": 0,
                   "samples_per_second": 0.0, "error": ""},
        "reason": "measured 1.40x the default's throughput",
        "seconds": 1.5,
        "measured": [
            {"instances": 1, "threads": 0, "cuda_graphs": False, "cpu_instances": 0,
             "samples_per_second": 100.0, "error": ""},
            {"instances": 2, "threads": 1, "cuda_graphs": False, "cpu_instances": 0,
             "samples_per_second": 140.0, "error": ""},
            {"instances": 2, "threads": 0, "cuda_graphs": True, "cpu_instances": 0,
             "samples_per_second": 0.0, "error": "cannot capture"},
        ],
    }  # fmt: skip
    assert http["batchserve"]["cpu_below_batch_size"] == 5
    assert http["batchserve"]["cpu_below_positions"] == 0


def test_the_device_split_of_a_model_with_free_axes_is_in_positions() -> None:
    """Its batch times, and so its crossover, are in positions: shown as such, never as a
    batch size."""
    (row,) = model_statistics([_served("img", 1, TUNING, positions=True)])
    assert (row.cpu_below_batch_size, row.cpu_below_positions) == (0, 40_000)
    (http,) = responses.statistics([row])["model_stats"]
    assert http["batchserve"]["cpu_below_positions"] == 40_000
    (grpc,) = messages.statistics([row]).model_stats
    assert (grpc.batchserve.cpu_below_batch_size, grpc.batchserve.cpu_below_positions) == (
        0,
        40_000,
    )


def test_a_decoupled_models_replies_count_by_index_and_outcome() -> None:
    """Triton's rules (infer_stats.cc): success and fail add compute and output time, an
    empty response its compute time, a cancel the time until it was seen."""
    stats = ModelStats()
    stats.record_response(0, "success", 100, 10)
    stats.record_response(1, "empty", 40)
    stats.record_response(0, "fail", 7, 1)
    stats.record_response(1, "cancel", 5)
    first, second = stats.responses[0], stats.responses[1]
    assert (first.success, first.fail) == (Duration(1, 110), Duration(1, 8))
    assert (first.compute_infer, first.compute_output) == (Duration(2, 107), Duration(2, 11))
    assert (second.empty_response, second.compute_infer) == (Duration(1, 40), Duration(1, 40))
    assert (second.cancel, second.compute_output) == (Duration(1, 5), Duration(0, 0))


def test_both_adapters_render_the_same_numbers() -> None:
    rows = model_statistics(
        [_served("a", 1), _served("b", 3, TUNING), _served("c", 1, TUNING, positions=True)]
    )
    http = responses.statistics(rows)
    grpc = responses.message_json(messages.statistics(rows))  # protobuf's JSON, as Triton's
    for model in grpc["model_stats"]:
        del model["batchserve"]["oom_splits"]
    for model in http["model_stats"]:
        cache: dict[str, Any] = {"count": 0, "ns": 0}
        assert model["inference_stats"]["cache_hit"] == cache  # no cache in use: zeros
        assert model["inference_stats"]["cache_miss"] == cache
    assert http == grpc
    assert [m["name"] for m in http["model_stats"]] == ["a", "b", "c"]
