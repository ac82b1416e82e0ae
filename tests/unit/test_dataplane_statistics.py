"""Triton's model statistics, built once from the live counters; both adapters render them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from batchserve.core.device import CPU, Device
from batchserve.dataplane.statistics import (
    InferBatchStatistics,
    InstanceMemory,
    MemoryUsage,
    StatisticDuration,
    model_statistics,
)
from batchserve.grpc import messages
from batchserve.models.memory_probe import MemoryProfile
from batchserve.models.model_table import InstanceMemory as MeasuredMemory
from batchserve.models.model_table import ServedVersion
from batchserve.observability.stats import ModelStats
from batchserve.rest import responses

MEMORY = (
    MeasuredMemory(Device("gpu", 1), MemoryProfile(1000, 20), 5000, 7),
    MeasuredMemory(CPU, MemoryProfile(3, 4), 600, 9),
)


def _served(name: str = "m", version: int = 2) -> ServedVersion:
    stats = ModelStats()
    stats.record_batch(4, 10, 200, 30)
    stats.record_batch(2, 11, 210, 31)
    stats.record_batch(4, 12, 220, 32)
    stats.record_request(True, 1000, 100)
    stats.record_request(False, 500, 0)
    stats.last_inference_ms = 1_700_000_000_000
    served = SimpleNamespace(
        name=name, version=version, stats=stats, batcher=SimpleNamespace(cap=8), memory=MEMORY
    )
    return cast(ServedVersion, served)


def test_statistics_are_the_counters_in_tritons_shape() -> None:
    (row,) = model_statistics([_served()])
    assert (row.name, row.version, row.last_inference) == ("m", "2", 1_700_000_000_000)
    assert (row.inference_count, row.execution_count) == (10, 3)
    stats = row.inference_stats
    assert (stats.success, stats.fail) == (StatisticDuration(1, 1000), StatisticDuration(1, 500))
    assert stats.queue == StatisticDuration(1, 100)
    assert stats.compute_infer == StatisticDuration(3, 630)
    assert row.batch_stats == (  # by batch size, as Triton lists them
        InferBatchStatistics(
            2, StatisticDuration(1, 11), StatisticDuration(1, 210), StatisticDuration(1, 31)
        ),
        InferBatchStatistics(
            4, StatisticDuration(2, 22), StatisticDuration(2, 420), StatisticDuration(2, 62)
        ),
    )
    assert row.memory_usage == (MemoryUsage("GPU", 1, 5000), MemoryUsage("CPU", 0, 600))
    assert row.batch_cap == 8
    assert row.instances == (
        InstanceMemory("gpu:1", 1000, 20, 5000, 7),
        InstanceMemory("cpu", 3, 4, 600, 9),
    )


def test_statistics_are_a_snapshot_of_the_counters() -> None:
    served = _served()
    (before,) = model_statistics([served])
    served.stats.record_batch(8, 1, 1, 1)
    served.stats.record_request(True, 1, 1)
    assert before.inference_count == 10
    assert before.inference_stats.success.count == 1
    assert [b.batch_size for b in before.batch_stats] == [2, 4]


def test_both_adapters_render_the_same_numbers() -> None:
    rows = model_statistics([_served("a", 1), _served("b", 3)])
    http = responses.statistics(rows)
    grpc = responses.message_json(messages.statistics(rows))  # protobuf's JSON, as Triton's
    for model in grpc["model_stats"]:
        del model["response_stats"]  # Triton's field batchserve leaves empty
        del model["batchserve"]["oom_splits"]
    for model in http["model_stats"]:
        cache: dict[str, Any] = {"count": 0, "ns": 0}
        assert model["inference_stats"].pop("cache_hit") == cache  # no cache: HTTP shows zeros
        assert model["inference_stats"].pop("cache_miss") == cache
    assert http == grpc
    assert [m["name"] for m in http["model_stats"]] == ["a", "b"]
