"""Triton-compatible cumulative statistics for one model version.

The scheduler records into these counters; the statistics endpoints (HTTP `/stats`,
gRPC ModelStatistics) and the Prometheus metrics read the same numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from batchserve.observability.latency_summaries import LatencySummaries
from batchserve.observability.metrics import Buckets, Observations, Rejection, rejection_of


@dataclass(slots=True)
class Duration:
    """A count and a cumulative duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """``count`` events of ``ns`` each."""
        self.count += count
        self.ns += ns * count


@dataclass(slots=True)
class BatchStats:
    """Per-batch-size compute durations."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """Triton's statistics of a request's N-th response (``response_stats``): the time
    to compute it (since the request's compute began, or the previous response) and to
    write its outputs, by how it went."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStats:
    """Counters for one model version, as Triton defines them.

    ``inference_count`` counts samples, ``execution_count`` counts batches run. Beyond
    Triton's: ``oom_splits`` counts batches split in two after running out of memory;
    ``padding_elements`` of the ``input_elements`` the model received were padding;
    ``received`` counts requests taken in (in flight: those not yet answered),
    ``rejections`` the failed ones by reason, ``observed`` the Prometheus distributions,
    ``sequences_expired`` the sequences released after idling past their timeout,
    ``stopped_batches`` the running batches stopped because their clients all left; with a
    ``latency_objective_ns``, ``objective_met`` and ``objective_missed`` count the requests
    answered within it and after it, ``batch_time_predicted_ns`` /
    ``batch_time_measured_ns`` sum the predicted and measured times of the batches run,
    ``objective_margin_ns`` is what the dispatch's plans keep free for their recent overruns,
    and ``objective_planned`` / ``objective_direct`` count the batches that went under a plan
    (they could wait for company) and those sent without one (waiting did not pay, or the
    batch was already full).
    """

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    """Triton's response cache: requests answered from it, and those looked up in vain,
    each with the time the lookup (and a miss's insertion) took."""
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    oom_splits: int = 0
    padding_elements: int = 0
    input_elements: int = 0
    received: int = 0
    sequences_expired: int = 0
    stopped_batches: int = 0
    latency_objective_ns: int = 0
    objective_met: int = 0
    objective_missed: int = 0
    batch_time_predicted_ns: int = 0
    batch_time_measured_ns: int = 0
    objective_margin_ns: int = 0
    objective_planned: int = 0
    objective_direct: int = 0
    outcomes: dict[tuple[str, bool], int] = field(default_factory=dict)  # (protocol, ok)
    rejections: dict[Rejection, int] = field(default_factory=dict)
    observed: Observations = field(default_factory=Observations)
    responses: dict[int, ResponseStats] = field(default_factory=dict)
    """Triton's ``response_stats``, by response index: one (0) per request of a model
    that answers once, one per reply of a decoupled model."""
    summaries: LatencySummaries | None = None
    """Triton's latency summaries, where ``--metrics-config summary_latencies=true``."""
    first_response: Buckets | None = None
    """Triton's first-response histogram (ms), where ``histogram_latencies=true``."""

    def record_batch(
        self,
        size: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        *,
        padding: int = 0,
        elements: int = 0,
        cap: int = 0,
    ) -> None:
        """One model execution of ``size`` samples, whose inputs held ``elements`` elements,
        ``padding`` of them padding, under a batch cap of ``cap`` (0: unknown)."""
        self.execution_count += 1
        self.inference_count += size
        self.padding_elements += padding
        self.input_elements += elements
        per_size = self.batches.get(size)
        if per_size is None:
            per_size = self.batches[size] = BatchStats()
        per_size.compute_input.add(input_ns)
        per_size.compute_infer.add(infer_ns)
        per_size.compute_output.add(output_ns)
        self.observed.on_batch(size, input_ns + infer_ns + output_ns, cap)

    def record_compute(
        self, requests: int, input_ns: int, infer_ns: int, output_ns: int, *, responses: bool = True
    ) -> None:
        """A batch run that answered ``requests`` requests, its executions' times summed;
        ``responses``: each request's one response counts as response 0 (a decoupled model
        counts its replies itself, ``record_response``).

        Triton's definition: each request answered adds its batch's compute, so these counts
        are requests and each mean is the compute of the batch a request ran in
        (perf_analyzer divides each sum by its count; the ``nv_inference_compute_*`` series
        are these sums). Per execution, the times are in ``batches``.
        """
        self.compute_input.add(input_ns, requests)
        self.compute_infer.add(infer_ns, requests)
        self.compute_output.add(output_ns, requests)
        if responses:
            self.record_response(0, "success", infer_ns, output_ns, requests)
        if (summaries := self.summaries) is not None:
            summaries.compute_input.observe(input_ns, requests)
            summaries.compute_infer.observe(infer_ns, requests)
            summaries.compute_output.observe(output_ns, requests)

    def record_response(
        self, index: int, outcome: str, infer_ns: int, output_ns: int = 0, count: int = 1
    ) -> None:
        """``count`` requests' ``index``-th response, as Triton counts it (``infer_stats.cc``):
        ``outcome`` success or fail adds its compute and output time to both and to itself;
        an empty response its compute time; a cancel the time until it was seen."""
        stats = self.responses.get(index)
        if stats is None:
            stats = self.responses[index] = ResponseStats()
        if outcome == "cancel":
            stats.cancel.add(infer_ns, count)
            return
        stats.compute_infer.add(infer_ns, count)
        if outcome == "empty":
            stats.empty_response.add(infer_ns, count)
            return
        stats.compute_output.add(output_ns, count)
        (stats.success if outcome == "success" else stats.fail).add(infer_ns + output_ns, count)

    def record_cache(self, hit: bool, ns: int) -> None:
        """A response-cache lookup that found the answer (``hit``) or not, timed as Triton
        times it: a hit's lookup, a miss's lookup and insertion."""
        (self.cache_hit if hit else self.cache_miss).add(ns)
        if (summaries := self.summaries) is not None:
            (summaries.cache_hit if hit else summaries.cache_miss).observe(ns)

    def record_batch_time(self, predicted_ns: int, measured_ns: int) -> None:
        """A batch run whole, its time as predicted before it went and as measured."""
        self.batch_time_predicted_ns += predicted_ns
        self.batch_time_measured_ns += measured_ns

    def record_request(
        self,
        ok: bool,
        total_ns: int,
        queue_ns: int,
        error: BaseException | None = None,
        protocol: str = "",
        count: int = 1,
        first_response_ns: int | None = None,
    ) -> None:
        """One request answered (or failed with ``error``) after ``total_ns``, ``queue_ns``
        of it queued, its first response after ``first_response_ns`` (None: its only one,
        at ``total_ns``); ``count`` requests with these very timings (a worker's group)."""
        (self.success if ok else self.fail).add(total_ns, count)
        key = (protocol, ok)
        self.outcomes[key] = self.outcomes.get(key, 0) + count
        if ok:
            self.queue.add(queue_ns, count)
            self.observed.on_request(total_ns, queue_ns, count)
            if (summaries := self.summaries) is not None:
                summaries.request.observe(total_ns, count)
                summaries.queue.observe(queue_ns, count)
            if self.first_response is not None:
                first = total_ns if first_response_ns is None else first_response_ns
                self.first_response.observe(first / 1e6, count)
            if self.latency_objective_ns:
                if total_ns <= self.latency_objective_ns:
                    self.objective_met += count
                else:
                    self.objective_missed += count
        elif error is not None and (reason := rejection_of(error)) is not None:
            self.rejections[reason] = self.rejections.get(reason, 0) + count
        self.last_inference_ms = time.time_ns() // 1_000_000
