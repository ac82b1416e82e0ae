"""Triton's metric families (``nv_*``), for the tools and dashboards written for Triton.

Model Analyzer checks that the server's ``nv_gpu_utilization`` lists the GPUs it profiles on
and reads its GPU columns from ``nv_gpu_*``; perf_analyzer's ``--collect-metrics`` reads the
same four GPU series; Triton's dashboards and the autoscalers built for it read
``nv_inference_*`` (``nv_inference_pending_request_count`` above all). Names, help texts,
labels and units are Triton's (``metrics.cc`` in Triton's core); the values are the
numbers the Triton statistics report, read at scrape time like every batchserve series, so
the two views agree. batchserve's own series stay as they are, with more detail.

Where Triton's meaning and batchserve's differ, the nearest is taken and said here:
failures by Triton's reasons, REJECTED for a full queue or a queue timeout, CANCELED for a
client gone, OTHER for an invalid request, BACKEND for the model's or the server's own
error; a pending request is one queued and not yet in a batch (a worker's group counts
each of its requests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

from batchserve.core.metrics_config import TRITON_DEFAULTS, MetricsConfig
from batchserve.devices.host import HostReading, HostUsage
from batchserve.devices.nvml import GpuMonitor, GpuReading
from batchserve.models.model_table import ServedVersion
from batchserve.models.registry import ModelRegistry
from batchserve.observability.exposition import Family
from batchserve.observability.latency_summaries import (
    FIRST_RESPONSE_FAMILY,
    LatencySummaries,
    SlidingQuantiles,
)
from batchserve.observability.metrics import Rejection
from batchserve.observability.stats import ModelStats

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_REASON_OF = {
    Rejection.QUEUE_FULL: "REJECTED",
    Rejection.TIMEOUT: "REJECTED",
    Rejection.CANCELLED: "CANCELED",
    Rejection.INVALID: "OTHER",
}
_StageOf = Callable[[LatencySummaries], SlidingQuantiles]
_SUMMARIES: tuple[tuple[str, str, _StageOf, bool | None], ...] = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in "
     "microseconds (includes cached requests)", lambda s: s.request, False),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in "
     "microseconds (includes cached requests)", lambda s: s.queue, None),
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in "
     "microseconds (does not include cached requests)", lambda s: s.compute_input, None),
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in "
     "microseconds (does not include cached requests)", lambda s: s.compute_infer, None),
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output "
     "duration in microseconds (does not include cached requests)", lambda s: s.compute_output,
     None),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in "
     "microseconds.", lambda s: s.cache_hit, True),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in "
     "microseconds.", lambda s: s.cache_miss, True),
)  # fmt: skip
"""Triton's summary families, with its help texts (``metrics.cc``), and for which models
(``metric_model_reporter.cc``): None every model; True only those using the response cache;
False only the others, as Triton leaves out the request summary of a cached model."""
_DurationOf = Callable[[ModelStats], int]
_DURATIONS: tuple[tuple[str, str, _DurationOf], ...] = (
    ("nv_inference_request_duration_us", "Cumulative inference request duration in "
     "microseconds (includes cached requests)", lambda s: s.success.ns),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in "
     "microseconds (includes cached requests)", lambda s: s.queue.ns),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in "
     "microseconds (does not include cached requests)", lambda s: s.compute_input.ns),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in "
     "microseconds (does not include cached requests)", lambda s: s.compute_infer.ns),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output "
     "duration in microseconds (does not include cached requests)", lambda s: s.compute_output.ns),
)  # fmt: skip


class TritonMetrics:
    """Builds Triton's families on each scrape from the registry, NVML and ``/proc``.

    Args:
        registry: the model registry (loaded versions, their stats and batchers).
        gpus: the NVML monitor; None where there is no GPU (no GPU families then).
        load_seconds: how long the latest load of each model took.
        host: the machine's CPU and memory; None: no CPU families.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        gpus: GpuMonitor | None,
        load_seconds: Mapping[str, float],
        host: HostUsage | None = None,
        metrics: MetricsConfig = TRITON_DEFAULTS,
    ) -> None:
        self._registry = registry
        self._gpus = gpus
        self._load_seconds = load_seconds
        self._host = host
        self._metrics = metrics

    def families(self) -> list[Family]:
        versions = self._registry.loaded()
        gpus = self._gpus.read() if self._gpus is not None else []
        return [
            *model_families(versions, self._load_seconds, self._metrics.counter_latencies),
            *summary_families(versions, self._metrics.summary_quantiles),
            histogram_family(versions),
            *cache_families(versions),
            *backend_families(versions),
            *gpu_families(gpus),
            *host_families(self._host.read() if self._host is not None else None),
        ]


def model_families(
    versions: list[ServedVersion], load_seconds: Mapping[str, float], counters: bool = True
) -> Iterator[Family]:
    """Per model version: counts, cumulative durations (``counters``: Triton's
    ``counter_latencies``), pending requests, load time."""
    success = Family(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        "counter",
    )
    failure = Family(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "counter",
    )
    count = Family(
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        "counter",
    )
    executions = Family(
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        "counter",
    )
    durations = [(Family(name, doc, "counter"), of) for name, doc, of in _DURATIONS]
    pending = Family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    )
    load = Family("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
    for served in versions:
        stats = served.stats
        labels = {"model": served.name, "version": str(served.version)}
        success.add(labels, stats.success.count)
        ensemble = served.config.HasField("ensemble_scheduling")
        for reason, n in failures(stats, ensemble).items():
            failure.add({**labels, "reason": reason}, n)
        count.add(labels, stats.inference_count)
        executions.add(labels, stats.execution_count)
        for family, of in durations:
            family.add(labels, of(stats) // 1000)
        pending.add(labels, served.batcher.pending_requests())
        if served.name in load_seconds:
            load.add(labels, load_seconds[served.name])
    yield from (success, failure, count, executions)
    if counters:
        yield from (family for family, _ in durations)
    yield from (pending, load)


def summary_families(
    versions: list[ServedVersion], quantiles: tuple[tuple[float, float], ...]
) -> Iterator[Family]:
    """Triton's latency summaries (``summary_latencies``), in microseconds: the quantiles
    of the last minute, count and sum since the start."""
    families = [Family(name, doc, "summary") for name, doc, _, _ in _SUMMARIES]
    wanted = [quantile for quantile, _ in quantiles]
    for served in versions:
        summaries = served.stats.summaries
        if summaries is None:
            continue
        labels = {"model": served.name, "version": str(served.version)}
        cached = served.batcher.cache is not None
        for family, (_, _, stage_of, only) in zip(families, _SUMMARIES, strict=True):
            if only is not None and only is not cached:
                continue
            stage = stage_of(summaries)
            for quantile, value in zip(wanted, stage.quantiles(wanted), strict=True):
                family.add({**labels, "quantile": _number_label(quantile)}, value / 1000)
            family.add(labels, stage.count, "_count")
            family.add(labels, stage.total / 1000, "_sum")
    yield from families


def cache_families(versions: list[ServedVersion]) -> Iterator[Family]:
    """Triton's per-model response cache counters, for the models that use the cache."""
    hits = Family("nv_cache_num_hits_per_model", "Number of cache hits per model", "counter")
    hit_us = Family(
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds", "counter",
    )  # fmt: skip
    misses = Family("nv_cache_num_misses_per_model", "Number of cache misses per model", "counter")
    miss_us = Family(
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds", "counter",
    )  # fmt: skip
    for served in versions:
        if served.batcher.cache is None:
            continue
        stats, labels = served.stats, {"model": served.name, "version": str(served.version)}
        hits.add(labels, stats.cache_hit.count)
        hit_us.add(labels, stats.cache_hit.ns // 1000)
        misses.add(labels, stats.cache_miss.count)
        miss_us.add(labels, stats.cache_miss.ns // 1000)
    yield from (hits, hit_us, misses, miss_us)


def backend_families(versions: list[ServedVersion]) -> list[Family]:
    """The counter families a backend registers itself, as Triton's backends do through its
    metrics API (the identity backend's ``input_byte_size_counter``): summed over a version's
    instances, one series per model version from its load on."""
    families: dict[str, Family] = {}
    for served in versions:
        totals: dict[str, int] = {}
        for loaded in served.instances:
            counters = getattr(loaded.instance.backend, "backend_counters", None)
            for name, doc, value in counters() if counters is not None else ():
                families.setdefault(name, Family(name, doc, "counter"))
                totals[name] = totals.get(name, 0) + value
        labels = {"model": served.name, "version": str(served.version)}
        for name, total in totals.items():
            families[name].add(labels, total)
    return list(families.values())


def histogram_family(versions: list[ServedVersion]) -> Family:
    """Triton's first-response histogram (``histogram_latencies``), in milliseconds."""
    family = Family(
        FIRST_RESPONSE_FAMILY, "Duration from request to first response in milliseconds",
        "histogram",
    )  # fmt: skip
    for served in versions:
        buckets = served.stats.first_response
        if buckets is None:
            continue
        labels = {"model": served.name, "version": str(served.version)}
        reached = 0
        for bound, count in zip((*buckets.bounds, math.inf), buckets.counts, strict=True):
            reached += count
            family.add({**labels, "le": _number_label(bound)}, reached, "_bucket")
        family.add(labels, reached, "_count")
        family.add(labels, buckets.total, "_sum")
    return family


def _number_label(value: float) -> str:
    """A bound or quantile as prometheus-cpp writes it: 100, 0.5, +Inf."""
    if value == math.inf:
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def failures(stats: ModelStats, ensemble: bool = False) -> dict[str, int]:
    """Failed requests by Triton's reasons; every reason is there, as Triton starts them.
    An ensemble's are all OTHER, as Triton reports its failures whatever failed a step (the
    step's own model counts the reason), and twice for a request that failed in its steps:
    Triton's ensemble scheduler counts one when it answers with the error and one when it
    lets the request go (its L0_model_queue ``test_policy_reject`` reads both). batchserve's
    own families and the statistics count each request once."""
    counts = dict.fromkeys(FAILURE_REASONS, 0)
    if ensemble:
        refused_before_steps = stats.rejections.get(Rejection.INVALID, 0)
        counts["OTHER"] = 2 * stats.fail.count - refused_before_steps
        return counts
    for rejection, n in stats.rejections.items():
        counts[_REASON_OF[rejection]] += n
    counts["BACKEND"] = stats.fail.count - sum(stats.rejections.values())
    return counts


def gpu_families(readings: list[GpuReading]) -> Iterator[Family]:
    """Per GPU, labelled with its UUID as Triton labels it; a figure the board does not
    report is left out for that board."""
    families = {
        "utilization": Family("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
        "total": Family("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
        "used": Family("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
        "power": Family("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
        "limit": Family("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
        "energy": Family("nv_energy_consumption", "GPU energy consumption in joules since "
                         "the Triton Server started", "counter"),
    }  # fmt: skip
    for gpu in readings:
        labels = {"gpu_uuid": gpu.uuid}
        values = {
            "utilization": gpu.utilization_ratio,
            "total": gpu.memory_total_bytes,
            "used": gpu.memory_used_bytes,
            "power": gpu.power_watts,
            "limit": gpu.power_limit_watts,
            "energy": gpu.energy_joules,
        }
        for key, value in values.items():
            if value is not None:
                families[key].add(labels, value)
    yield from families.values()


def host_families(reading: HostReading | None) -> Iterator[Family]:
    """The machine's CPU use since the previous scrape and its memory."""
    if reading is None:
        return
    utilization = Family("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
    total = Family("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge")
    used = Family("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge")
    utilization.add({}, reading.cpu_utilization_ratio)
    total.add({}, reading.memory_total_bytes)
    used.add({}, reading.memory_used_bytes)
    yield from (utilization, total, used)
