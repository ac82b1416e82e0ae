"""Instances of one placement past the first two load on the second's measured profile, all
at once, between measurements: real ONNX Runtime sessions in a real registry."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.base import Arrays
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import Device
from batchserve.core.errors import BackendError
from batchserve.models.measuring_gate import MeasuringGate
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import MEASURED_EACH_PLACEMENT, ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.memory import MemoryBudgets
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio

CONFIG = """name: "wide" max_batch_size: 16
input [{ name: "x" data_type: TYPE_FP32 dims: [4096] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4096] }]
dynamic_batching {}
instance_group [{ count: COUNT, kind: KIND_CPU }]
"""


class Recorded(OnnxBackend):
    """A real session noting the rows it ran and how many loads ran beside its own."""

    loading = 0
    most_loading = 0
    lock = threading.Lock()

    def __init__(self, fail_load: bool = False, elsewhere: bool = False) -> None:
        super().__init__()
        self.rows: list[int] = []
        self.fail_load = fail_load
        self.elsewhere = elsewhere
        """Whether it says it loaded on a GPU, as a twin placed differently would."""
        self.closed = False

    @property
    def device(self) -> Device:
        return Device("gpu", 0) if self.elsewhere else super().device

    def unload(self) -> None:
        self.closed = True
        super().unload()

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        with Recorded.lock:
            Recorded.loading += 1
            Recorded.most_loading = max(Recorded.most_loading, Recorded.loading)
        try:
            time.sleep(0.2)  # long enough for the others to start theirs
            if self.fail_load:
                raise BackendError("the runtime refused this session")
            super().load(model_file, config, device)
        finally:
            with Recorded.lock:
                Recorded.loading -= 1

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.rows.append(len(inputs["x"]))
        return super().infer(inputs, output_names)


def _registry(
    root: Path, made: list[Recorded], fail_at: int = -1, count: int = 4, elsewhere_at: int = -1
) -> ModelRegistry:
    write_model(
        root / "wide" / "1" / "model.onnx",
        build_model([("x", FP32, ("N", 4096))], [("y", FP32, ("N", 4096))]),
    )
    (root / "wide" / "config.pbtxt").write_text(CONFIG.replace("COUNT", str(count)))

    def factory(config: ModelConfig, path: Path) -> Recorded:
        made.append(Recorded(fail_load=len(made) == fail_at, elsewhere=len(made) == elsewhere_at))
        return made[-1]

    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    return ModelRegistry(ModelRepository(root), 8, budgets, factory, cpus=2)  # two loads at once


async def test_instances_past_the_second_load_together_on_its_profile(tmp_path: Path) -> None:
    made: list[Recorded] = []
    Recorded.most_loading = 0
    registry = _registry(tmp_path, made)
    await registry.load("wide")
    served = registry.get("wide")
    assert MEASURED_EACH_PLACEMENT == 2
    probed = [1, 4, 16, 16]  # the probe's sizes, its largest twice
    assert [backend.rows for backend in made] == [probed, probed, [16], [16]]
    assert Recorded.most_loading == 2  # the two twins, never a probe beside them
    memories = [loaded.memory for loaded in served.instances]
    assert [m.profile for m in memories[2:]] == [memories[1].profile] * 2
    assert [m.batch_cap for m in memories] == [16] * 4
    assert [m.reserved_bytes for m in memories[2:]] == [memories[1].reserved_bytes] * 2
    budget = registry.budgets.for_device(memories[0].device)
    assert budget.total_bytes - budget.unreserved() == sum(m.reserved_bytes for m in memories)
    await registry.close()


async def test_a_twin_that_fails_to_load_leaves_nothing_held(tmp_path: Path) -> None:
    made: list[Recorded] = []
    registry = _registry(tmp_path, made, fail_at=3)
    budget = registry.budgets.for_device(Device("cpu", 0))
    before = budget.unreserved()
    with pytest.raises(BackendError, match="refused this session"):
        await registry.load("wide")
    assert budget.unreserved() == before
    assert len(made) == 4
    await registry.close()


def test_a_measurement_waits_for_the_loads_and_holds_off_new_ones() -> None:
    gate = MeasuringGate()
    events: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def load(name: str, held: threading.Event | None = None) -> None:
        with gate.loading():
            events.append(f"{name} in")
            if held is not None:
                first_in.set()
                held.wait(5)
            events.append(f"{name} out")

    def measure() -> None:
        with gate.measuring():
            events.append("measure in")
            time.sleep(0.05)
            events.append("measure out")

    first = threading.Thread(target=load, args=("first", release_first))
    first.start()
    assert first_in.wait(5)
    beside = threading.Thread(target=load, args=("beside",))
    beside.start()
    beside.join(5)  # loads run beside each other
    measuring = threading.Thread(target=measure)
    measuring.start()
    time.sleep(0.1)
    late = threading.Thread(target=load, args=("late",))
    late.start()
    time.sleep(0.1)
    assert "measure in" not in events
    assert "late in" not in events
    release_first.set()
    for thread in (first, measuring, late):
        thread.join(5)
    assert events == [
        "first in", "beside in", "beside out", "first out",
        "measure in", "measure out", "late in", "late out",
    ]  # fmt: skip


async def test_instances_added_to_a_served_model_load_on_its_measured_profile(
    tmp_path: Path,
) -> None:
    made: list[Recorded] = []
    registry = _registry(tmp_path, made, count=2)
    await registry.load("wide")
    served = registry.get("wide")
    config = ModelConfig()
    config.CopyFrom(served.config)
    config.instance_group[0].count = 4
    await registry.change_instances("wide", config)
    probed = [1, 4, 16, 16]
    assert [backend.rows for backend in made] == [probed, probed, [16], [16]]
    memories = [loaded.memory for loaded in registry.get("wide").instances]
    assert len(memories) == 4
    assert [m.profile for m in memories[2:]] == [memories[1].profile] * 2
    await registry.close()


async def test_a_twin_its_runtime_placed_elsewhere_is_measured_on_its_own(tmp_path: Path) -> None:
    made: list[Recorded] = []
    registry = _registry(tmp_path, made, elsewhere_at=3)
    await registry.load("wide")
    probed = [1, 4, 16, 16]
    assert [backend.rows for backend in made] == [probed, probed, [16], [], probed]
    assert made[3].closed
    assert len(registry.get("wide").instances) == 4
    await registry.close()
