"""The warm-up batch at an instance's cap, which the memory probe leaves out where it ran that
size already, run on a real ONNX Runtime session."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.base import Arrays
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import CPU
from batchserve.devices.placement import Placement
from batchserve.models.instance_loader import InstanceLoader
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_directory import ModelVersion
from batchserve.proto.model_config_pb2 import TYPE_FP32, ModelConfig, ModelInput
from batchserve.scheduler.memory import MemoryBudgets, ModelReservations

from tests.unit.onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio

MAX_BATCH = 256
ROW = 1 << 16  # floats in a row: 256 KiB a sample, far above the runtime's noise


class RowsRun(OnnxBackend):
    """A real session that notes the rows of every batch it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.rows.append(len(inputs["x"]))
        return super().infer(inputs, output_names)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return write_model(
        tmp_path / "1" / "model.onnx",
        build_model([("x", FP32, ("N", ROW))], [("y", FP32, ("N", ROW))]),
    )


async def _load(model_file: Path, limit_bytes: int = 0) -> tuple[RowsRun, int]:
    config = ModelConfig(
        name="wide", max_batch_size=MAX_BATCH,
        input=[ModelInput(name="x", data_type=TYPE_FP32, dims=[ROW])],
    )  # fmt: skip
    config.batchserve.memory_budget_bytes = limit_bytes
    backend = RowsRun()
    loader = InstanceLoader(
        MemoryBudgets(parse_budgets(None), device_total_bytes), lambda _c, _f: backend
    )
    reservations = ModelReservations.from_config(config)
    loaded = await loader.load(
        "wide_0", config, ModelVersion(1, model_file), Placement(CPU, b""), reservations
    )
    await loader.close(loaded, reservations)
    return backend, loaded.memory.batch_cap


async def test_the_cap_the_probe_ran_twice_is_not_run_again(model_file: Path) -> None:
    backend, cap = await _load(model_file)
    assert cap == MAX_BATCH
    assert backend.rows == [1, 64, MAX_BATCH, MAX_BATCH]


async def test_a_cap_under_the_probe_s_sizes_is_warmed_up(model_file: Path) -> None:
    """A model budget of about 100 rows: the probe stops at 64, which it runs twice, and the
    warm-up runs the cap it derived."""
    backend, cap = await _load(model_file, limit_bytes=100 * ROW * 4 * 2)
    assert 64 < cap < MAX_BATCH
    assert backend.rows == [1, 64, 64, cap]
