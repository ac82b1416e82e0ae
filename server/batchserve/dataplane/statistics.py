"""Triton's model statistics, built once from the live counters for both statistics
endpoints; each adapter only renders them (HTTP as JSON, gRPC as ModelStatisticsResponse).

The names follow Triton's messages (``grpc_service.proto``), plus batchserve's own figures:
the batch cap in use, what each instance was measured to need, and the instances and threads
measured at load (``Tuning``, re-exported for the adapters with ``Setting`` and ``Trial``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from batchserve.models.measured_defaults import Setting, Trial, Tuning
from batchserve.models.model_table import ServedVersion
from batchserve.observability.stats import BatchStats, Duration, ResponseStats

__all__ = ["Setting", "Trial", "Tuning"]  # what adapters render of measured defaults


@dataclass(frozen=True, slots=True)
class StatisticDuration:
    """How many, and their cumulative time in nanoseconds."""

    count: int
    ns: int


@dataclass(frozen=True, slots=True)
class InferStatistics:
    """Requests that succeeded or failed, their time queued, and the compute of the batches
    they ran in."""

    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration = StatisticDuration(0, 0)
    cache_miss: StatisticDuration = StatisticDuration(0, 0)


RESPONSE_KINDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")
"""The figures of each response index, Triton's names."""


@dataclass(frozen=True, slots=True)
class InferResponseStatistics:
    """A request's N-th responses (Triton's ``response_stats``)."""

    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    success: StatisticDuration
    fail: StatisticDuration
    empty_response: StatisticDuration
    cancel: StatisticDuration


@dataclass(frozen=True, slots=True)
class InferBatchStatistics:
    """The compute of the batches of one size."""

    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """What one instance holds of a device's budget; ``type`` is "CPU" or "GPU"."""

    type: str
    id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    """What one instance was measured to need, and what it reserved; ``device`` is "cpu" or
    "gpu:N"."""

    device: str
    fixed_bytes: int
    per_sample_bytes: int
    reserved_bytes: int
    batch_cap: int
    batch_steps: int = 0


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One served version's statistics, batch sizes in increasing order."""

    name: str
    version: str
    last_inference: int  # milliseconds since the epoch
    inference_count: int  # samples, not requests
    execution_count: int  # batches run
    inference_stats: InferStatistics
    batch_stats: tuple[InferBatchStatistics, ...]
    memory_usage: tuple[MemoryUsage, ...]
    batch_cap: int  # the cap the scheduler uses now
    instances: tuple[InstanceMemory, ...]
    measured_defaults: Tuning | None = None
    cpu_below_batch_size: int = 0  # with CPU and GPU instances: where batches split
    batch_steps: int = 0  # positions per batch now (steps, pixels); 0: counted in rows
    cpu_below_positions: int = 0  # the split of a model with free axes, in positions
    response_stats: tuple[tuple[str, InferResponseStatistics], ...] = ()
    """By response index, as Triton keys them ("0", "1", ...)."""


def model_statistics(served: Iterable[ServedVersion]) -> list[ModelStatistics]:
    """The statistics of each version, in the order given."""
    return [_model_statistics(version) for version in served]


def _model_statistics(served: ServedVersion) -> ModelStatistics:
    s = served.stats
    crossover, positions = served.batcher.routing.cpu_below, served.batcher.counts_positions
    return ModelStatistics(
        name=served.name,
        version=str(served.version),
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=InferStatistics(
            success=_duration(s.success),
            fail=_duration(s.fail),
            queue=_duration(s.queue),
            compute_input=_duration(s.compute_input),
            compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
            cache_hit=_duration(s.cache_hit),
            cache_miss=_duration(s.cache_miss),
        ),
        batch_stats=tuple(_batch(size, b) for size, b in sorted(s.batches.items())),
        memory_usage=tuple(
            MemoryUsage(m.device.kind.upper(), m.device.index, m.reserved_bytes)
            for m in served.memory
        ),
        batch_cap=served.batcher.cap,
        instances=tuple(
            InstanceMemory(
                device=str(m.device),
                fixed_bytes=m.profile.fixed_bytes,
                per_sample_bytes=m.profile.per_sample_bytes,
                reserved_bytes=m.reserved_bytes,
                batch_cap=m.batch_cap,
                batch_steps=m.batch_steps,
            )
            for m in served.memory
        ),
        measured_defaults=served.tuning,
        cpu_below_batch_size=0 if positions else crossover,
        batch_steps=served.batcher.policy.max_batch_steps,
        cpu_below_positions=crossover if positions else 0,
        response_stats=tuple((str(i), _response(r)) for i, r in sorted(s.responses.items())),
    )


def _response(r: ResponseStats) -> InferResponseStatistics:
    return InferResponseStatistics(**{kind: _duration(getattr(r, kind)) for kind in RESPONSE_KINDS})


def _duration(d: Duration) -> StatisticDuration:
    return StatisticDuration(d.count, d.ns)


def _batch(size: int, b: BatchStats) -> InferBatchStatistics:
    return InferBatchStatistics(
        batch_size=size,
        compute_input=_duration(b.compute_input),
        compute_infer=_duration(b.compute_infer),
        compute_output=_duration(b.compute_output),
    )
