"""An instance count the memory budget can never hold is refused after two instances, not
probed one by one until the budget runs out: real ONNX Runtime sessions, measured by the
real memory probe."""

from __future__ import annotations

import time
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


def _registry(root: Path, extra: str, made: list[Path]) -> ModelRegistry:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG + extra)

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
