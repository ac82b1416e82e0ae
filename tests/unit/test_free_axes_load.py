"""A model with free image axes loads and is measured at an image's size, not 1x1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.selection import create_backend
from batchserve.core.budgets import parse_budgets
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_table import ServedVersion
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.scheduler.batch_time import BatchTimeModel
from batchserve.scheduler.memory import PROBE_SEQUENCE_LENGTH, MemoryBudgets
from onnx import helper, numpy_helper
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio

CONFIG = """
name: "cnn" max_batch_size: 4
input [{ name: "image" data_type: TYPE_FP32 dims: [3, -1, -1] }]
output [{ name: "features" data_type: TYPE_FP32 dims: [4, -1, -1] }]
dynamic_batching {}
"""


def _unpadded_cnn(path: Path) -> None:
    """A 3x3 convolution without padding: an image must be at least 3x3, as after any
    exporter that keeps height and width free (``batchserve export --input
    image:FP32:batch,3,h,w``)."""
    weight = numpy_helper.from_array(
        np.random.default_rng(0).random((4, 3, 3, 3), dtype=np.float32), "weight"
    )
    conv = helper.make_node("Conv", ["image", "weight"], ["features"], kernel_shape=[3, 3])
    model = build_model(
        [("image", FP32, ("N", 3, "h", "w"))],
        [],
        initializers=[weight],
        nodes=[conv],
    )
    model.graph.output.append(helper.make_tensor_value_info("features", FP32, ["N", 4, "h2", "w2"]))
    write_model(path, model)


@asynccontextmanager
async def _served_cnn(repo: Path) -> AsyncIterator[ServedVersion]:
    """The unpadded CNN loaded from a repository of its own."""
    _unpadded_cnn(repo / "cnn" / "1" / "model.onnx")
    (repo / "cnn" / "config.pbtxt").write_text(CONFIG)
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(repo), 8, budgets, create_backend)
    try:
        await registry.load("cnn")
        yield registry.get("cnn")
    finally:
        await registry.close()


async def test_an_unpadded_cnn_with_free_height_and_width_loads_and_is_measured(
    tmp_path: Path,
) -> None:
    """Probed and warmed up at 1x1, its convolution refused the image ("Invalid input
    shape") and the model never loaded."""
    async with _served_cnn(tmp_path) as served:
        (instance,) = served.memory
        features = 4 * (PROBE_SEQUENCE_LENGTH - 2) ** 2 * 4  # one row's output, in bytes
        assert instance.profile.per_sample_bytes >= features  # an image's cost, not a pixel's


async def test_its_batch_times_are_seeded_in_pixels(tmp_path: Path) -> None:
    """The probe's timed batches seed the batch-time model with their pixels, not their
    rows (``batch_time.py``): the objective and the CPU/GPU split predict by them."""
    async with _served_cnn(tmp_path) as served:
        (loaded,) = served.instances
        per_row = PROBE_SEQUENCE_LENGTH**2
        assert loaded.memory.probe_row_positions == per_row
        timed = [(s.batch_size, s.run_ns) for s in loaded.memory.profile.samples if s.run_ns]
        assert len(timed) >= 2
        expected = BatchTimeModel()
        for rows, ns in timed:
            expected.record(rows * per_row, ns)
        assert served.batcher.batch_time(loaded.instance.name) == expected
