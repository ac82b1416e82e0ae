"""The Prometheus collector: every batchserve series, read from the live objects at scrape time.

Nothing here runs per request. Counters come from each version's ``ModelStats`` (the same
numbers as the Triton statistics), gauges from its batcher, the memory budgets and NVML.
Only models the registry holds appear, so an unknown model name never creates a series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from batchserve.devices.nvml import GpuMonitor, GpuReading
from batchserve.models.model_table import UNLOADED, IndexEntry, ModelState, ServedVersion
from batchserve.models.registry import ModelRegistry
from batchserve.observability.grpc_core_counts import CoreCallCounts, read_core_call_counts
from batchserve.observability.metrics import NS, Buckets, Rejection
from batchserve.observability.refusals import REFUSALS, Refusals
from batchserve.scheduler.sequences import SequenceBatcher

VERSION_LABELS = ("model", "version")
GPU_METRICS = (
    "batchserve_gpu_info",
    "batchserve_gpu_memory_used_bytes",
    "batchserve_gpu_memory_total_bytes",
    "batchserve_gpu_utilization_ratio",
    "batchserve_gpu_temperature_celsius",
    "batchserve_gpu_power_watts",
)
"""Series that exist only where NVML sees a GPU."""


def _labels(served: ServedVersion) -> list[str]:
    return [served.name, str(served.version)]


def _counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=[*VERSION_LABELS, *extra])


def _gauge(name: str, doc: str, labels: Iterable[str] = VERSION_LABELS) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


@dataclass(frozen=True, slots=True)
class _HistogramSpec:
    name: str
    doc: str
    field: Callable[[ServedVersion], Buckets]
    scale: float = 1


_HISTOGRAMS = (
    _HistogramSpec(
        "batchserve_request_duration_seconds",
        "End-to-end time of successful requests, from arrival to answer.",
        lambda s: s.stats.observed.request,
        NS,
    ),
    _HistogramSpec(
        "batchserve_queue_duration_seconds",
        "Time successful requests waited in the queue before their batch ran.",
        lambda s: s.stats.observed.queue,
        NS,
    ),
    _HistogramSpec(
        "batchserve_compute_duration_seconds",
        "Time one model execution took: input merge, inference, output split.",
        lambda s: s.stats.observed.compute,
        NS,
    ),
    _HistogramSpec(
        "batchserve_batch_size",
        "Samples per model execution.",
        lambda s: s.stats.observed.batch_size,
    ),
    _HistogramSpec(
        "batchserve_batch_occupancy_ratio",
        "Samples per model execution over the batch cap at the time.",
        lambda s: s.stats.observed.occupancy,
    ),
)


class ServerCollector(Collector):
    """Builds every batchserve family from ``registry`` (and ``gpus``) on each scrape.

    Args:
        registry: the model registry (models, their stats and batchers, memory budgets).
        gpus: the NVML monitor; None where there is no GPU (no GPU series then).
        load_seconds: how long the latest load of each model took.
        clock: monotonic nanoseconds, the batchers' clock (queue ages are measured on it).
        request_memory: (bytes held, bytes allowed) by the requests in flight of every
            request-handling process (``core/request_memory.py``); None: no such series.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        gpus: GpuMonitor | None = None,
        load_seconds: Mapping[str, float] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        refusals: Refusals = REFUSALS,
        grpc_core: Callable[[], CoreCallCounts | None] = read_core_call_counts,
        workers: Callable[[], Mapping[int, tuple[int, int]]] | None = None,
        request_memory: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self._registry = registry
        self._gpus = gpus
        self._load_seconds = load_seconds if load_seconds is not None else {}
        self._clock = clock
        self._refusals = refusals
        self._grpc_core = grpc_core
        self._workers = workers
        self._request_memory = request_memory

    def collect(self) -> Iterator[Metric]:
        versions = self._registry.loaded()
        now_ns = self._clock()
        yield from _request_families(versions)
        yield from _histogram_families(versions)
        yield from _batcher_families(versions)
        yield from _model_families(self._registry.index(), self._load_seconds)
        yield from _config_families(versions)
        yield from _memory_families(self._registry, versions)
        if self._gpus is not None:
            yield from gpu_families(self._gpus.read())
        yield _saturation_family(versions, now_ns)
        yield _refusal_family(self._refusals)
        if self._request_memory is not None:
            yield from _request_memory_families(*self._request_memory())
        core = self._grpc_core()
        if core is not None:
            yield from _grpc_core_families(core)
        if self._workers is not None:
            yield from _worker_families(self._workers())


def metrics_registry(collector: ServerCollector) -> CollectorRegistry:
    """The server's own registry, not the process-wide default: ``collector`` plus the
    process, Python platform and garbage-collector metrics prometheus_client provides."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(collector)
    return registry


def _request_memory_families(held: int, limit: int) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "batchserve_request_memory_held_bytes",
        "Bytes the requests in flight hold, bodies and answers not yet taken, summed over "
        "the request-handling processes (--max-request-memory).",
        value=held,
    )
    yield GaugeMetricFamily(
        "batchserve_request_memory_limit_bytes",
        "What --max-request-memory allows them, each request-handling process an even share: "
        "past its share a process refuses new requests (reason request_memory).",
        value=limit,
    )


def _refusal_family(refusals: Refusals) -> Metric:
    family = CounterMetricFamily(
        "batchserve_refusals",
        "Connections and requests the server turned away before any model ran them: size "
        "and time limits, malformed framing, overload, not ready or draining, and access.",
        labels=["protocol", "reason"],
    )
    for (protocol, reason), count in sorted(refusals.snapshot().items()):
        family.add_metric([protocol.value, reason.value], count)
    return family


def _worker_families(handed_over: Mapping[int, tuple[int, int]]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "batchserve_worker_requests",
        "Inference requests each request-handling worker decoded and handed to the "
        "model-owning process (--workers), a replaced worker's included.",
        labels=("worker",),
    )
    handoffs = CounterMetricFamily(
        "batchserve_worker_handoffs",
        "Frames those requests travelled in: requests of one event-loop pass with the same "
        "model and layout go as one (requests / handoffs is the mean group).",
        labels=("worker",),
    )
    for index, (count, frames) in sorted(handed_over.items()):
        requests.add_metric([str(index)], count)
        handoffs.add_metric([str(index)], frames)
    yield requests
    yield handoffs


def _grpc_core_families(core: CoreCallCounts) -> Iterator[Metric]:
    """Core's own counts: its refusals (oversized messages, calls caught by shutdown) are
    among ``failed`` and nowhere else."""
    for name, doc, value in (
        ("started", "gRPC calls grpc core received.", core.started),
        ("succeeded", "gRPC calls that ended OK.", core.succeeded),
        ("failed", "gRPC calls that ended with any other status, grpc core's own refusals "
         "included (these never reach batchserve_refusals_total).", core.failed),
    ):  # fmt: skip
        family = CounterMetricFamily(f"batchserve_grpc_core_calls_{name}", doc)
        family.add_metric([], value)
        yield family


def _request_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    requests = _counter(
        "batchserve_requests",
        "Inference requests answered, by protocol and outcome.",
        ("protocol", "outcome"),
    )
    rejected = _counter(
        "batchserve_rejected_requests",
        "Requests turned away: queue full, timed out in the queue, client gone "
        "(cancelled), or invalid. Each is also a failed request.",
        ("reason",),
    )
    splits = _counter(
        "batchserve_oom_splits",
        "Batches split in two and retried after the runtime ran out of memory.",
    )
    stopped = _counter(
        "batchserve_stopped_batches",
        "Running batches stopped because their clients all went away (where the runtime "
        "can stop a run: ONNX Runtime).",
    )
    for served in versions:
        stats, labels = served.stats, _labels(served)
        for (protocol, ok), count in sorted(stats.outcomes.items()):
            outcome = "success" if ok else "failure"
            requests.add_metric([*labels, protocol or "internal", outcome], count)
        for reason in Rejection:
            rejected.add_metric([*labels, reason.value], stats.rejections.get(reason, 0))
        splits.add_metric(labels, stats.oom_splits)
        stopped.add_metric(labels, stats.stopped_batches)
    yield from (requests, rejected, splits, stopped)
    yield from _padding_families(versions)
    yield from _sequence_families(versions)
    yield from _objective_families(versions)


def _objective_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    """Models with a latency objective only: requests answered within it and after it, the
    batch times the dispatch predicted against those measured, the batches it planned and
    those it sent at once, and the margin its plans keep for their overruns."""
    within = _counter(
        "batchserve_objective_requests",
        "Requests answered within the model's latency objective (met) or after it (missed).",
        ("outcome",),
    )
    predicted = _counter(
        "batchserve_batch_time_predicted_seconds",
        "Sum of the batch times predicted before each batch went (objective-driven dispatch).",
    )
    measured = _counter(
        "batchserve_batch_time_measured_seconds",
        "Sum of the measured times of the same batches: against the predicted sum, the "
        "accuracy of the batch-time model.",
    )
    dispatches = _counter(
        "batchserve_objective_batches",
        "Batches that went under a plan, able to wait for company up to the objective's due "
        "time (planned), or without one: waiting did not pay at the arrival rate, or the "
        "batch was already full (direct).",
        ("dispatch",),
    )
    margin = _gauge(
        "batchserve_objective_margin_seconds",
        "What the dispatch's plans keep free of the objective for their recent overruns (the "
        "95th percentile of how late past its planned finish a request was answered).",
    )
    for served in versions:
        stats, labels = served.stats, _labels(served)
        if not stats.latency_objective_ns:
            continue
        within.add_metric([*labels, "met"], stats.objective_met)
        within.add_metric([*labels, "missed"], stats.objective_missed)
        predicted.add_metric(labels, stats.batch_time_predicted_ns / 1e9)
        measured.add_metric(labels, stats.batch_time_measured_ns / 1e9)
        margin.add_metric(labels, stats.objective_margin_ns / 1e9)
        dispatches.add_metric([*labels, "planned"], stats.objective_planned)
        dispatches.add_metric([*labels, "direct"], stats.objective_direct)
    yield from (within, predicted, measured, dispatches, margin)


def _sequence_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    """Sequence models only: sequences live now, those of them waiting for a candidate slot,
    and those released after idling."""
    live = _gauge("batchserve_sequences_live", "Sequences started and not yet ended or expired.")
    backlog = _gauge(
        "batchserve_sequences_backlog",
        "Live sequences waiting for a candidate slot (max_batch_size or max_candidate_sequences "
        "per instance) to free.",
    )
    expired = _counter(
        "batchserve_sequences_expired",
        "Sequences released after max_sequence_idle_microseconds without a request.",
    )
    for served in versions:
        if isinstance(served.batcher, SequenceBatcher):
            live.add_metric(_labels(served), served.batcher.live)
            backlog.add_metric(_labels(served), served.batcher.backlog)
            expired.add_metric(_labels(served), served.stats.sequences_expired)
    yield from (live, backlog, expired)


def _padding_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    """Sequence models only: padded elements against all elements the model received."""
    padding = _counter(
        "batchserve_batch_padding_elements",
        "Input elements that were padding (sequence batches padded to their longest request).",
    )
    elements = _counter(
        "batchserve_batch_input_elements", "Input elements the model received, padding included."
    )
    for served in versions:
        if served.batcher.policy.sequence_inputs:
            padding.add_metric(_labels(served), served.stats.padding_elements)
            elements.add_metric(_labels(served), served.stats.input_elements)
    yield from (padding, elements)


def _histogram_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    for spec in _HISTOGRAMS:
        family = HistogramMetricFamily(spec.name, spec.doc, labels=list(VERSION_LABELS))
        for served in versions:
            buckets = spec.field(served)
            family.add_metric(
                _labels(served), buckets.cumulative(spec.scale), buckets.total / spec.scale
            )
        yield family


def _batcher_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    depth = _gauge("batchserve_queue_depth", "Requests waiting in the queue.")
    inflight = _gauge(
        "batchserve_inflight_requests",
        "Requests received and not yet answered (queued or running).",
    )
    busy = _gauge("batchserve_busy_instances", "Model instances running a batch now.")
    instances = _gauge("batchserve_instances", "Model instances loaded.")
    cap = _gauge(
        "batchserve_batch_cap",
        "Most samples per batch now: max_batch_size, lowered by the memory budget "
        "and after running out of memory.",
    )
    for served in versions:
        labels, batcher, stats = _labels(served), served.batcher, served.stats
        depth.add_metric(labels, len(batcher.queue))
        answered = stats.success.count + stats.fail.count
        inflight.add_metric(labels, stats.received - answered)
        busy.add_metric(labels, batcher.pool.busy_count())
        instances.add_metric(labels, len(batcher.pool.instances))
        cap.add_metric(labels, batcher.cap)
    yield from (depth, inflight, busy, instances, cap)


def _model_families(index: list[IndexEntry], load_seconds: Mapping[str, float]) -> Iterator[Metric]:
    """Load state of each model loaded, loading, or failed to load; a model never asked for,
    or unloaded on purpose, has no state series (its absence is not an alarm)."""
    state = _gauge(
        "batchserve_model_state",
        "1 for the state the model is in, 0 for the others (Triton's states).",
        ("model", "state"),
    )
    seen: set[str] = set()
    for row in index:
        never_loaded = not row.state
        idle = never_loaded or (
            row.state == ModelState.UNAVAILABLE and row.reason in ("", UNLOADED)
        )
        if idle or row.name in seen:
            continue
        seen.add(row.name)
        for value in ModelState:
            state.add_metric([row.name, value.value], float(row.state == value))
    load = _gauge(
        "batchserve_model_load_duration_seconds",
        "How long the latest successful load of the model took (measure, reserve memory, warm up).",
        ("model",),
    )
    for name in sorted(seen & set(load_seconds)):
        load.add_metric([name], load_seconds[name])
    yield from (state, load)


def _config_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    objective = _gauge(
        "batchserve_model_latency_objective_seconds",
        "The model's latency objective (batchserve.latency_objective_microseconds), "
        "where one is set.",
    )
    for served in versions:
        micros = served.config.batchserve.latency_objective_microseconds
        if micros:
            objective.add_metric(_labels(served), micros / 1e6)
    yield objective


def _memory_families(registry: ModelRegistry, versions: list[ServedVersion]) -> Iterator[Metric]:
    budget = _gauge(
        "batchserve_memory_budget_bytes",
        "Memory budget of a device, shared by every model instance on it.",
        ("device",),
    )
    reserved = _gauge(
        "batchserve_memory_reserved_bytes",
        "Memory of a device's budget reserved by loaded model instances.",
        ("device",),
    )
    lent = _gauge(
        "batchserve_memory_lent_bytes",
        "Memory of a device's budget lent now to batches larger than their instance's "
        "reservation, for their runs.",
        ("device",),
    )
    for device_budget in registry.budgets.budgets():
        device = [str(device_budget.device)]
        budget.add_metric(device, device_budget.total_bytes)
        reserved.add_metric(device, sum(device_budget.holdings().values()))
        lent.add_metric(device, device_budget.lent_bytes)
    yield from (budget, reserved, lent)
    yield from _model_memory_families(versions)


def _model_memory_families(versions: list[ServedVersion]) -> Iterator[Metric]:
    held = _gauge(
        "batchserve_model_memory_bytes",
        "Memory reserved by the model version's instances on a device.",
        (*VERSION_LABELS, "device"),
    )
    limit = _gauge(
        "batchserve_model_memory_budget_bytes",
        "The model's own limit (batchserve.memory_budget_bytes), where one is set.",
    )
    for served in versions:
        per_device: dict[str, int] = {}
        for instance in served.memory:
            device = str(instance.device)
            per_device[device] = per_device.get(device, 0) + instance.reserved_bytes
        for device, nbytes in sorted(per_device.items()):
            held.add_metric([*_labels(served), device], nbytes)
        if served.config.batchserve.memory_budget_bytes:
            limit.add_metric(_labels(served), served.config.batchserve.memory_budget_bytes)
    yield from (held, limit)


_GPU_DOCS = (
    "1 for each GPU NVML sees, with its product name and UUID.",
    "Device memory in use on the GPU, by every process.",
    "Device memory installed on the GPU.",
    "Share of the last sample period a kernel ran on the GPU.",
    "GPU core temperature.",
    "GPU board power draw.",
)


def gpu_families(readings: list[GpuReading]) -> Iterator[Metric]:
    info = _gauge(GPU_METRICS[0], _GPU_DOCS[0], ("device", "name", "uuid"))
    used, total, utilization, temperature, power = (
        _gauge(name, doc, ("device",))
        for name, doc in zip(GPU_METRICS[1:], _GPU_DOCS[1:], strict=True)
    )
    for gpu in readings:
        device = [f"gpu:{gpu.index}"]
        info.add_metric([*device, gpu.name, gpu.uuid], 1)
        used.add_metric(device, gpu.memory_used_bytes)
        total.add_metric(device, gpu.memory_total_bytes)
        optional = (
            (utilization, gpu.utilization_ratio),
            (temperature, gpu.temperature_celsius),
            (power, gpu.power_watts),
        )
        for family, value in optional:
            if value is not None:
                family.add_metric(device, value)
    yield from (info, used, total, utilization, temperature, power)


def delay_budget_ns(served: ServedVersion) -> int:
    """How long a request may wait: the latency objective, else ``max_queue_delay``; 0: none."""
    config = served.config
    micros = config.batchserve.latency_objective_microseconds
    return 1000 * (micros or config.dynamic_batching.max_queue_delay_microseconds)


def saturation(served: ServedVersion, now_ns: int) -> float:
    """How close one version is to its capacity; 1 means at it.

    The larger of: the oldest queued request's wait over the delay budget, and the queued
    samples over what every instance could take in one batch (the cap is what the memory
    budget allows, so this is the memory headroom left for batching).
    """
    batcher = served.batcher
    backlog = batcher.queue.samples / (batcher.cap * max(1, len(batcher.pool.instances)))
    oldest, budget = batcher.queue.oldest_enqueued_ns(), delay_budget_ns(served)
    waited = (now_ns - oldest) / budget if oldest is not None and budget else 0.0
    return max(backlog, waited)


def _saturation_family(versions: list[ServedVersion], now_ns: int) -> Metric:
    family = _gauge(
        "batchserve_saturation",
        "How close this server is to its capacity (1 = at it; made to drive an "
        "autoscaler): the highest over models of queue wait over the delay budget "
        "and queued samples over one batch per instance.",
        (),
    )
    family.add_metric([], max((saturation(s, now_ns) for s in versions), default=0.0))
    return family
