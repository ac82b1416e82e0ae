"""Counts a memory budget can never hold, against real ONNX Runtime sessions measured by the
real memory probe: an instance count is refused after two instances, not probed one by one
until the budget runs out; a ``max_batch_size`` of 2147483647 is served at the batch cap the
budget allows, the probe climbing to it in steps."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from batchserve.backends.selection import create_backend
from batchserve.core.budgets import parse_budgets
from batchserve.core.errors import ModelConfigError
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_table import ModelState
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FAKE_CONFIG
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio


def _registry(root: Path, extra: str, made: list[Path], config: str = FAKE_CONFIG) -> ModelRegistry:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(config + extra)

    def counted(config: ModelConfig, path: Path) -> Any:
        made.append(path)
        return create_backend(config, path)

    budgets = MemoryBudgets(parse_budgets("cpu=256MiB"), device_total_bytes)
    return ModelRegistry(ModelRepository(root), 8, budgets, counted, cpus=1)


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        ("instance_group [{ count: 100000, kind: KIND_CPU }]", "the budget of 256 MiB"),
        (
            "instance_group [{ count: 100000, kind: KIND_CPU }] "
            "batchserve { memory_budget_bytes: 33554432 }",
            "its memory_budget_bytes of 32 MiB",
        ),
    ],
)
async def test_a_count_the_budget_can_never_hold_fails_after_two_instances(
    tmp_path: Path, extra: str, limit: str
) -> None:
    made: list[Path] = []
    registry = _registry(tmp_path, extra, made)
    started = time.monotonic()
    with pytest.raises(ModelConfigError) as refused:
        await registry.load("fake")
    assert "model 'fake': 99998 more instance(s) on cpu need at least" in refused.value.message
    assert f"more than {limit}; lower the instance_group count" in refused.value.message
    assert len(made) == 2, "two sessions measured, none after"
    assert time.monotonic() - started < 30
    (row,) = registry.index()
    assert (row.state, row.reason) == (ModelState.UNAVAILABLE.value, refused.value.message)
    await registry.close()


async def test_a_count_that_fits_still_loads_every_instance(tmp_path: Path) -> None:
    made: list[Path] = []
    registry = _registry(tmp_path, "instance_group [{ count: 3, kind: KIND_CPU }]", made)
    await registry.load("fake")
    assert len(registry.get("fake").instances) == 3
    await registry.close()


async def test_a_huge_max_batch_size_is_served_at_the_cap_the_budget_allows(
    tmp_path: Path,
) -> None:
    """The probe's second batch was a quarter of the maximum: for 2147483647, 536,870,911 rows
    (numpy asked for 128 GiB for digits_cnn). Now the sizes climb 64-fold while the ones
    measured predict they fit. 2**24 here, so that a regression asks for MiBs, not GiBs."""
    made: list[Path] = []
    big = FAKE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 16777216")
    extra = "batchserve { memory_budget_bytes: 67108864 }"
    registry = _registry(tmp_path, extra, made, big)
    await registry.load("fake")
    served = registry.get("fake")
    (loaded,) = served.instances
    assert 1 < loaded.memory.batch_cap < 2**24
    assert loaded.memory.reserved_bytes <= 64 << 20
    probed = [sample.batch_size for sample in loaded.memory.profile.samples]
    assert probed[:3] == [1, 64, 4096], probed
    assert all(later <= 64 * earlier for earlier, later in pairwise(probed)), probed
    await registry.close()
