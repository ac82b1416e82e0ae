"""Prometheus metrics: bucket counting, and the collector over a real registry, dataplane and
batcher (fake backend) scraped through the real exposition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import httpx
import numpy as np
import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.errors import (
    BackendError,
    DeadlineExceeded,
    InvalidArgument,
    ModelConfigError,
    NotFound,
    Overloaded,
    Unavailable,
)
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, Tensor
from batchserve.dataplane.plane import DataPlane
from batchserve.devices.host import HostUsage
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.observability.metrics import (
    LATENCY_BUCKETS_NS,
    Buckets,
    Rejection,
    metrics_app,
    rejection_of,
)
from batchserve.observability.stats import ModelStats
from batchserve.rest.responses import statistics
from batchserve.runtime.metrics_collector import ServerCollector, metrics_registry
from batchserve.runtime.triton_metrics import TritonMetrics, failures
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FAKE_CONFIG, FP32, FakeBackend
from onnx_models import FP32 as ONNX_FP32
from onnx_models import build_model, write_model
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio
NO_HOST = HostUsage(Path("/nonexistent"))

CONFIG = FAKE_CONFIG + "batchserve { latency_objective_microseconds: 1000 }\n"
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def test_buckets_count_a_value_in_the_first_bucket_at_or_above_it() -> None:
    buckets = Buckets((1, 5, 10))
    for value in (0, 1, 1.5, 5, 11):
        buckets.observe(value)
    assert buckets.cumulative() == [("1.0", 2), ("5.0", 4), ("10.0", 4), ("+Inf", 5)]
    assert buckets.count == 5
    assert buckets.total == 18.5


def test_latency_buckets_resolve_100_microseconds_to_10_seconds() -> None:
    seconds = [bound / 1e9 for bound in LATENCY_BUCKETS_NS]
    assert seconds[0] == 0.0001
    assert seconds[-1] == 10
    assert all(b / a <= 2.5 for a, b in pairwise(seconds))


def test_rejection_reason_follows_the_error_class() -> None:
    assert rejection_of(Overloaded("full")) is Rejection.QUEUE_FULL
    assert rejection_of(DeadlineExceeded("late")) is Rejection.TIMEOUT
    assert rejection_of(asyncio.CancelledError()) is Rejection.CANCELLED
    assert rejection_of(InvalidArgument("bad")) is Rejection.INVALID
    assert rejection_of(ModelConfigError("bad")) is Rejection.INVALID
    assert rejection_of(Unavailable("unloading")) is None
    assert rejection_of(BackendError("broken")) is None


@dataclass
class Served:
    """A real registry and dataplane over the fake backend, and a way to scrape them."""

    registry: ModelRegistry
    dataplane: DataPlane
    backends: list[FakeBackend]
    collector: ServerCollector

    def scrape(self) -> Samples:
        text = generate_latest(metrics_registry(self.collector)).decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def triton(self) -> Samples:
        """Triton's families (``nv_*``) as the metrics port builds them, by exact name."""
        families = TritonMetrics(self.registry, None, {"fake": 0.25}, NO_HOST).families()
        return {
            (family.name, frozenset(labels.items())): value
            for family in families
            for labels, value in family.samples
        }


def _repository(root: Path) -> ModelRepository:
    x, y, total = (
        ("x", ONNX_FP32, ("N", 4)),
        ("y", ONNX_FP32, ("N", 4)),
        ("total", ONNX_FP32, ("N", 1)),
    )
    model = build_model([x], [y, total])
    for name in ("fake", "other"):
        write_model(root / name / "1" / "model.onnx", model)
        (root / name / "config.pbtxt").write_text(CONFIG.replace('"fake"', f'"{name}"'))
    return ModelRepository(root)


HELD_BYTES = 8 << 20
"""What each fake instance holds, so that its reservation is a measurement of the load and not
of whatever else the test process freed or took meanwhile (it measured 0 once under load)."""


def _served(root: Path, queue_size: int, clock: Callable[[], int] = time.monotonic_ns) -> Served:
    backends: list[FakeBackend] = []

    def factory(*_: object) -> FakeBackend:
        backends.append(FakeBackend(holds_bytes=HELD_BYTES))
        return backends[-1]

    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(_repository(root), queue_size, budgets, factory)
    dataplane = DataPlane(Settings(model_repository=root), registry, ["fake"])
    collector = ServerCollector(registry, None, {"fake": 0.25}, clock)
    return Served(registry, dataplane, backends, collector)


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    # The tests hold a run at the backend's gate, which only an instance's thread can wait
    # at: a batch size measured fast at load runs on the event loop (``inline.py``), and
    # that run held the loop, the test with it, until the gate's timeout.
    monkeypatch.setattr("batchserve.models.registry.INLINE_BELOW_NS", 0)
    served = _served(tmp_path, queue_size=1)
    await served.registry.load("fake")
    yield served
    for backend in served.backends:
        backend.gate.set()
    await served.registry.close()


def _request(rows: int, model: str = "fake", **fields: object) -> InferRequest:
    data = np.ones((rows, 4), np.float32)
    fields.setdefault("protocol", "http")
    return InferRequest(model, inputs=[Tensor("x", FP32, data.shape, data)], **fields)  # type: ignore[arg-type]


def _of(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


FAKE = {"model": "fake", "version": "1"}


async def test_series_appear_for_loaded_models_only(served: Served) -> None:
    with pytest.raises(NotFound):
        await served.dataplane.infer(_request(1, model="nope"))
    samples = served.scrape()
    models = {dict(labels).get("model") for _, labels in samples} - {None}
    assert models == {"fake"}  # "other" is in the repository but was never loaded
    assert _of(samples, "batchserve_model_state", model="fake", state="READY") == 1
    assert _of(samples, "batchserve_model_state", model="fake", state="LOADING") == 0
    assert _of(samples, "batchserve_model_load_duration_seconds", model="fake") == 0.25
    assert _of(samples, "batchserve_model_latency_objective_seconds", **FAKE) == 0.001
    assert not any(name.startswith("batchserve_gpu_") for name in _names(samples))
    assert "batchserve_batch_padding_elements_total" not in _names(samples)  # not a sequence model


async def test_counters_and_histograms_are_the_model_stats(served: Served) -> None:
    for rows in (1, 3, 8):
        await served.dataplane.infer(_request(rows))
    bad = InferRequest(
        "fake", inputs=[Tensor("nope", FP32, (1, 4), np.ones((1, 4), np.float32))], protocol="http"
    )
    with pytest.raises(InvalidArgument):
        await served.dataplane.infer(bad)
    stats = served.registry.get("fake").stats
    samples = served.scrape()
    assert (
        _of(samples, "batchserve_requests_total", outcome="success", protocol="http", **FAKE) == 3
    )
    assert (
        _of(samples, "batchserve_requests_total", outcome="failure", protocol="http", **FAKE) == 1
    )
    assert _of(samples, "batchserve_rejected_requests_total", reason="invalid", **FAKE) == 1
    assert _of(samples, "batchserve_rejected_requests_total", reason="queue_full", **FAKE) == 0
    assert _of(samples, "batchserve_request_duration_seconds_count", **FAKE) == stats.success.count
    assert _of(samples, "batchserve_request_duration_seconds_sum", **FAKE) == pytest.approx(
        stats.success.ns / 1e9
    )
    assert _of(samples, "batchserve_queue_duration_seconds_sum", **FAKE) == pytest.approx(
        stats.queue.ns / 1e9
    )
    batches = stats.batches.values()
    compute_ns = sum(b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns for b in batches)
    assert _of(samples, "batchserve_compute_duration_seconds_sum", **FAKE) == pytest.approx(
        compute_ns / 1e9
    )
    assert _of(samples, "batchserve_batch_size_count", **FAKE) == stats.execution_count == 3
    assert _of(samples, "batchserve_batch_size_sum", **FAKE) == stats.inference_count == 12
    assert _of(samples, "batchserve_batch_size_bucket", le="4.0", **FAKE) == 2
    assert _of(samples, "batchserve_batch_occupancy_ratio_sum", **FAKE) == pytest.approx(12 / 8)
    assert _of(samples, "batchserve_batch_occupancy_ratio_bucket", le="1.0", **FAKE) == 3
    assert _of(samples, "batchserve_inflight_requests", **FAKE) == 0
    # Triton's names over the same counters: what its statistics report, durations in µs
    nv = served.triton()
    assert _of(nv, "nv_inference_request_success", **FAKE) == stats.success.count == 3
    failures = {r: _of(nv, "nv_inference_request_failure", reason=r, **FAKE) for r in REASONS}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}  # the invalid one
    assert _of(nv, "nv_inference_count", **FAKE) == 12
    assert _of(nv, "nv_inference_exec_count", **FAKE) == 3
    assert _of(nv, "nv_inference_request_duration_us", **FAKE) == stats.success.ns // 1000
    assert _of(nv, "nv_inference_queue_duration_us", **FAKE) == stats.queue.ns // 1000
    for part in ("input", "infer", "output"):
        ns = getattr(stats, f"compute_{part}").ns
        assert _of(nv, f"nv_inference_compute_{part}_duration_us", **FAKE) == ns // 1000
    assert _of(nv, "nv_inference_pending_request_count", **FAKE) == 0
    assert _of(nv, "nv_model_load_duration_secs", **FAKE) == 0.25
    assert not [name for name, _ in nv if name.startswith(("nv_gpu", "nv_energy", "nv_cpu"))]


async def test_stats_endpoint_shows_none_of_the_metrics_fields(served: Served) -> None:
    await served.dataplane.infer(_request(2))
    document = str(statistics(served.dataplane.model_statistics("fake")))
    for added in ("received", "rejections", "observed", "occupancy"):
        assert added not in document


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("condition not reached")


async def test_queue_gauges_saturation_and_a_full_queue(tmp_path: Path) -> None:
    now = [0]
    served = _served(tmp_path, queue_size=1, clock=lambda: now[0])
    await served.registry.load("fake")
    batcher = served.registry.get("fake").batcher
    served.backends[0].gate.clear()
    running = asyncio.create_task(served.dataplane.infer(_request(1)))
    await _until(lambda: batcher.pool.busy_count() == 1)
    queued = asyncio.create_task(served.dataplane.infer(_request(4)))
    await _until(lambda: len(batcher.queue) == 1)
    with pytest.raises(Overloaded):
        await served.dataplane.infer(_request(1))
    oldest = batcher.queue.oldest_enqueued_ns()
    assert oldest is not None
    now[0] = oldest
    at_arrival = served.scrape()
    now[0] = oldest + 3_000_000  # scraped 3 ms after the queued request arrived
    samples = served.scrape()
    nv = served.triton()
    served.backends[0].gate.set()
    await asyncio.gather(running, queued)
    await served.registry.close()
    assert _of(samples, "batchserve_queue_depth", **FAKE) == 1
    assert _of(samples, "batchserve_inflight_requests", **FAKE) == 2
    assert _of(samples, "batchserve_busy_instances", **FAKE) == 1
    assert _of(samples, "batchserve_instances", **FAKE) == 1
    assert _of(samples, "batchserve_batch_cap", **FAKE) == 8
    assert _of(samples, "batchserve_rejected_requests_total", reason="queue_full", **FAKE) == 1
    # one request of 4 rows awaits a batch; the one refused for a full queue was rejected
    assert _of(nv, "nv_inference_pending_request_count", **FAKE) == 1
    assert _of(nv, "nv_inference_request_failure", reason="REJECTED", **FAKE) == 1
    # 4 samples queued for one instance with a cap of 8; then 3 ms of queue wait against the
    # 1 ms latency objective
    assert _of(at_arrival, "batchserve_saturation") == 0.5
    assert _of(samples, "batchserve_saturation") == 3


async def test_timeouts_and_cancelled_requests_are_counted_by_reason(served: Served) -> None:
    batcher = served.registry.get("fake").batcher
    served.backends[0].gate.clear()
    running = asyncio.create_task(served.dataplane.infer(_request(1)))
    await _until(lambda: batcher.pool.busy_count() == 1)
    late = asyncio.create_task(served.dataplane.infer(_request(1, timeout_us=1)))
    with pytest.raises(DeadlineExceeded):  # at its deadline, while the instance is busy
        await asyncio.wait_for(late, 5)
    served.backends[0].gate.set()
    await running
    served.backends[0].gate.clear()
    running = asyncio.create_task(served.dataplane.infer(_request(1)))
    await _until(lambda: batcher.pool.busy_count() == 1)
    gone = asyncio.create_task(served.dataplane.infer(_request(1, is_cancelled=lambda: True)))
    await _until(lambda: len(batcher.queue) == 1)
    served.backends[0].gate.set()
    await running
    with pytest.raises(asyncio.CancelledError):
        await gone
    samples = served.scrape()
    assert _of(samples, "batchserve_rejected_requests_total", reason="timeout", **FAKE) == 1
    assert _of(samples, "batchserve_rejected_requests_total", reason="cancelled", **FAKE) == 1
    nv = served.triton()
    failures = {r: _of(nv, "nv_inference_request_failure", reason=r, **FAKE) for r in REASONS}
    assert failures == {"REJECTED": 1, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert (
        _of(samples, "batchserve_requests_total", outcome="failure", protocol="http", **FAKE) == 2
    )
    assert _of(samples, "batchserve_inflight_requests", **FAKE) == 0


async def test_a_model_error_is_a_backend_failure_in_tritons_reasons(served: Served) -> None:
    served.backends[0].poison = 1.0  # the request's rows are ones
    with pytest.raises(BackendError):
        await served.dataplane.infer(_request(2))
    nv = served.triton()
    failures = {r: _of(nv, "nv_inference_request_failure", reason=r, **FAKE) for r in REASONS}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert _of(nv, "nv_inference_request_success", **FAKE) == 0


async def test_memory_series_are_the_reservations_and_budgets(served: Served) -> None:
    version = served.registry.get("fake")
    samples = served.scrape()
    reserved = sum(m.reserved_bytes for m in version.memory)
    assert reserved >= HELD_BYTES
    assert _of(samples, "batchserve_model_memory_bytes", device="cpu", **FAKE) == reserved
    assert _of(samples, "batchserve_memory_reserved_bytes", device="cpu") == reserved
    budget = served.registry.budgets.budgets()[0]
    assert _of(samples, "batchserve_memory_budget_bytes", device="cpu") == budget.total_bytes
    assert _of(samples, "batchserve_memory_lent_bytes", device="cpu") == 0
    loan = budget.lend("fake", 12345)
    assert _of(served.scrape(), "batchserve_memory_lent_bytes", device="cpu") == 12345
    loan.close()


async def test_an_unloaded_model_leaves_no_series(served: Served) -> None:
    await served.registry.unload("fake")
    samples = served.scrape()
    assert not [key for key in samples if ("model", "fake") in key[1]]
    assert _of(samples, "batchserve_saturation") == 0


async def test_a_model_that_failed_to_load_shows_as_unavailable(tmp_path: Path) -> None:
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    failing = ModelRegistry(_repository(tmp_path), 1, budgets, _broken_backend)
    dataplane = DataPlane(Settings(model_repository=tmp_path), failing, ["other"])
    with pytest.raises(BackendError):
        await failing.load("other")
    samples = Served(failing, dataplane, [], ServerCollector(failing)).scrape()
    assert _of(samples, "batchserve_model_state", model="other", state="UNAVAILABLE") == 1
    assert _of(samples, "batchserve_model_state", model="other", state="READY") == 0
    assert (
        "batchserve_model_load_duration_seconds",
        frozenset({("model", "other")}),
    ) not in samples


def _broken_backend(*_: object) -> FakeBackend:
    raise BackendError("cannot create a session: the model file is corrupt")


async def test_the_endpoint_writes_tritons_families_and_nothing_to_a_client_gone(
    served: Served,
) -> None:
    triton = TritonMetrics(served.registry, None, {"fake": 0.25}, NO_HOST)
    app = metrics_app(metrics_registry(served.collector), None, triton.families)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as client:
        text = (await client.get("/metrics")).text
    assert '\nnv_inference_request_success{model="fake",version="1"} 0\n' in text
    sent: list[object] = []

    async def gone() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: object) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/metrics", "headers": [], "query_string": b""}
    await app(scope, gone, send)
    assert sent == []


async def test_endpoint_speaks_openmetrics_when_asked_and_text_otherwise(served: Served) -> None:
    app = metrics_app(metrics_registry(served.collector))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as client:
        text = await client.get("/metrics")
        openmetrics = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
        )
        elsewhere = await client.get("/")
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "batchserve_requests_total" in text.text
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.endswith("# EOF\n")
    assert elsewhere.status_code == 404


async def test_a_request_the_codec_refuses_counts_as_invalid_for_its_model(served: Served) -> None:
    def malformed() -> InferRequest:
        raise InvalidArgument("tensor 'x': expected 16 bytes, got 3")

    with pytest.raises(InvalidArgument):
        served.dataplane.decode(malformed, "fake", "", "grpc")
    with pytest.raises(InvalidArgument):
        served.dataplane.decode(malformed, "unknown-model", "", "grpc")
    samples = served.scrape()
    assert _of(samples, "batchserve_rejected_requests_total", reason="invalid", **FAKE) == 1
    assert (
        _of(samples, "batchserve_requests_total", outcome="failure", protocol="grpc", **FAKE) == 1
    )
    assert not any(dict(labels).get("model") == "unknown-model" for _, labels in samples)
    assert _of(samples, "batchserve_inflight_requests", **FAKE) == 0  # received and answered


def test_an_ensemble_failing_in_its_steps_counts_twice_in_tritons_failure_metric() -> None:
    """Triton's ensemble scheduler reports a failed request once when it answers with the
    error and once when it lets the request go, both as OTHER (L0_model_queue
    ``test_policy_reject`` expects 4 for two); refused before any step (invalid), once.
    batchserve's own count stays one a request."""
    stats = ModelStats()
    stats.record_request(False, 1_000, 0, DeadlineExceeded("Request timeout expired"))
    stats.record_request(False, 1_000, 0, Overloaded("Exceeds maximum queue size"))
    stats.record_request(False, 1_000, 0, InvalidArgument("unexpected inference input 'x'"))
    assert failures(stats, ensemble=True) == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0,
                                              "OTHER": 5}  # fmt: skip
    assert failures(stats) == {"REJECTED": 2, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}
    assert stats.fail.count == 3
