"""Server-wide refusal counts: which errors count as refusals, and how they are exposed."""

from __future__ import annotations

from pathlib import Path

import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.errors import (
    ControlDisabled,
    InvalidArgument,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
)
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.observability.grpc_core_counts import CoreCallCounts, read_core_call_counts
from batchserve.observability.refusals import Protocol, Reason, Refusals
from batchserve.runtime.metrics_collector import ServerCollector, metrics_registry
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FakeBackend
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PayloadTooLarge("big"), Reason.BODY_TOO_LARGE),
        (Overloaded("full"), Reason.OVERLOADED),
        (ControlDisabled("off"), Reason.CONTROL_DISABLED),
        (Unavailable("draining"), Reason.UNAVAILABLE),
        (Unauthenticated("token"), Reason.UNAUTHENTICATED),
    ],
)
def test_an_error_that_refuses_work_is_counted_under_its_own_reason(
    error: Exception, reason: Reason
) -> None:
    refusals = Refusals()
    refusals.count_error(Protocol.GRPC, error)
    assert refusals.snapshot() == {(Protocol.GRPC, reason): 1}


@pytest.mark.parametrize(
    "error", [InvalidArgument("bad"), NotFound("who"), RuntimeError("model bug")]
)
def test_a_client_mistake_or_a_failure_is_not_a_refusal(error: Exception) -> None:
    refusals = Refusals()
    refusals.count_error(Protocol.HTTP, error)
    assert refusals.snapshot() == {}


def test_the_collector_exposes_each_count_by_protocol_and_reason(tmp_path: Path) -> None:
    refusals = Refusals()
    for _ in range(3):
        refusals.count(Protocol.HTTP, Reason.HEAD_TOO_LARGE)
    refusals.count(Protocol.GRPC, Reason.OVERLOADED)
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(tmp_path), 1, budgets, lambda *_: FakeBackend())
    collector = ServerCollector(registry, refusals=refusals)
    text = generate_latest(metrics_registry(collector)).decode()
    samples = {
        (s.name, s.labels.get("protocol"), s.labels.get("reason")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "batchserve_refusals_total"
    }
    assert samples == {
        ("batchserve_refusals_total", "http", "head_too_large"): 3,
        ("batchserve_refusals_total", "grpc", "overloaded"): 1,
    }


def test_grpc_cores_own_counts_are_exposed_beside_the_refusals(tmp_path: Path) -> None:
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(tmp_path), 1, budgets, lambda *_: FakeBackend())
    counts = CoreCallCounts(started=7, succeeded=4, failed=3)
    collector = ServerCollector(registry, refusals=Refusals(), grpc_core=lambda: counts)
    text = generate_latest(metrics_registry(collector)).decode()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("batchserve_grpc_core_calls_")
    }
    assert samples == {
        "batchserve_grpc_core_calls_started_total": 7,
        "batchserve_grpc_core_calls_succeeded_total": 4,
        "batchserve_grpc_core_calls_failed_total": 3,
    }


def test_grpc_core_counts_come_from_this_grpcio() -> None:
    """The private call grpcio-channelz uses is there: a grpcio upgrade that drops it fails here."""
    counts = read_core_call_counts()
    assert counts is not None
    assert counts.started >= counts.succeeded + counts.failed
