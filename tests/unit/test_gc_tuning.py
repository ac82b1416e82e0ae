"""The collector settings the server runs with: what ``settle`` freezes and what it still frees."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.errors import ModelConfigError
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.runtime import gc_tuning
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FAKE_CONFIG, FakeBackend
from onnx_models import FP32, build_model, write_model


class Node:
    """Half of a reference cycle, weakly referenceable."""

    partner: Node | None = None


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    """Leave the test process's collector as it was: the same thresholds, and frozen only
    if it was (earlier tests that loaded models froze it, as the server does; unfrozen, a
    grpc.aio server one of them left behind is finalized at interpreter exit, where its
    finalizer fails: an empty "Error in sys.excepthook" after the summary)."""
    thresholds, was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
    yield
    gc.unfreeze()
    if was_frozen:
        gc.freeze()
    gc.set_threshold(*thresholds)


def _tracked(obj: object) -> bool:
    """True while the collector still walks ``obj`` (frozen objects are not listed)."""
    return any(candidate is obj for candidate in gc.get_objects())


def test_settle_takes_what_exists_out_of_later_collections() -> None:
    survivor: list[object] = []
    assert _tracked(survivor)
    gc_tuning.settle()
    assert not _tracked(survivor)
    assert gc.get_freeze_count() > 0


def test_a_cycle_frozen_by_one_settle_is_freed_by_the_next() -> None:
    first, second = Node(), Node()
    first.partner, second.partner = second, first
    alive = weakref.ref(first)
    gc_tuning.settle()
    del first, second
    gc.collect()
    assert alive() is not None, "a frozen cycle is out of the collector's reach"
    gc_tuning.settle()
    assert alive() is None


def test_settle_says_how_much_it_froze_and_how_long_the_pause_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=gc_tuning.__name__):
        gc_tuning.settle()
    (record,) = [r for r in caplog.records if r.getMessage() == "heap frozen"]
    # objects frozen then freed by reference counting leave the count; none join it
    assert record.frozen_objects >= gc.get_freeze_count() > 0
    assert record.collect_ms >= 0


def test_tune_raises_only_the_young_threshold() -> None:
    _, middle, old = gc.get_threshold()
    gc_tuning.tune(12_345)
    assert gc.get_threshold() == (12_345, middle, old)


def _registry(root: Path, changes: list[str]) -> ModelRegistry:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG)
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    return ModelRegistry(
        ModelRepository(root), 8, budgets, lambda *_: FakeBackend(),
        after_change=lambda: changes.append("settled"),
    )  # fmt: skip


@pytest.mark.anyio
async def test_the_registry_settles_after_each_load_and_unload_that_swaps_models(
    tmp_path: Path,
) -> None:
    changes: list[str] = []
    registry = _registry(tmp_path, changes)
    await registry.load("fake")
    assert changes == ["settled"]
    await registry.load("fake")  # a reload replaces the served version
    assert changes == ["settled"] * 2
    await registry.unload("fake")
    assert changes == ["settled"] * 3
    (tmp_path / "fake" / "config.pbtxt").write_text("not a config {")
    with pytest.raises(ModelConfigError):
        await registry.load("fake")
    assert changes == ["settled"] * 3, "a failed load swaps nothing: what it made is not frozen"
    await registry.close()
