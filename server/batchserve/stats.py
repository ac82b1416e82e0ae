"""Triton-compatible cumulative statistics for one model version.

The scheduler records into these counters; the statistics endpoints (HTTP `/stats`,
gRPC ModelStatistics) and the Prometheus metrics read the same numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    """A count and a cumulative duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStats:
    """Per-batch-size compute durations."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStats:
    """Counters for one model version, as Triton defines them.

    ``inference_count`` counts samples, ``execution_count`` counts batches run.
    """

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)

    def record_batch(self, size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution of ``size`` samples."""
        self.execution_count += 1
        self.inference_count += size
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)
        per_size = self.batches.get(size)
        if per_size is None:
            per_size = self.batches[size] = BatchStats()
        per_size.compute_input.add(input_ns)
        per_size.compute_infer.add(infer_ns)
        per_size.compute_output.add(output_ns)

    def record_request(self, ok: bool, total_ns: int, queue_ns: int) -> None:
        """One request answered (or failed) after ``total_ns``, ``queue_ns`` of it queued."""
        (self.success if ok else self.fail).add(total_ns)
        if ok:
            self.queue.add(queue_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000
