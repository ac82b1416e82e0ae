"""A model whose config leaves instances and threads to the server is loaded with what the
load measured; a reload of the same config keeps it, a changed config is measured anew."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import CPU
from batchserve.models import instance_loader, measured_defaults, placing
from batchserve.models.load_override import LoadOverride
from batchserve.models.measured_defaults import DEFAULT, Setting
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.memory import MemoryBudgets, MemoryProfile, MemorySample
from fakes import FAKE_CONFIG, fake_config
from onnx_models import FP32, build_model, write_model
from test_measured_defaults import CostedBackend

pytestmark = pytest.mark.anyio

PROFILE = MemoryProfile(1024, 1024, (MemorySample(1, 2048, 1000), MemorySample(8, 9216, 4000)))


def _fake_probe(backend: Any, model_file: Path, config: ModelConfig, device: Any, **_: Any) -> Any:
    backend.load(model_file, config, device)
    return PROFILE


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    """What every backend the registry makes did (``CostedBackend``); probes are not measured."""
    monkeypatch.setattr(instance_loader, "probe_backend", _fake_probe)
    monkeypatch.setattr(measured_defaults, "ROUND_S", 0.03)
    monkeypatch.setattr(measured_defaults, "light_sample_ns", lambda: 1e6)  # 4 ms a row: heavy
    return []


def _registry(root: Path, log: list[tuple[str, int, str]], cpus: int = 4) -> ModelRegistry:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(
        FAKE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 16")
    )

    def backend(*_: Any) -> CostedBackend:  # 4 ms a row: far from light
        return CostedBackend(0.004, log, fail_graphs=False, gpu_run_s=0.0)

    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    return ModelRegistry(ModelRepository(root), 8, budgets, backend, cpus=cpus)


def _loads(log: list[tuple[str, int, str]]) -> int:
    return len([entry for entry in log if entry[0] == "load"])


async def test_the_measured_setting_is_what_serves(
    tmp_path: Path, log: list[tuple[str, int, str]]
) -> None:
    registry = _registry(tmp_path, log)
    await registry.load("fake")
    served = registry.get("fake")
    assert served.tuning is not None
    assert served.tuning.chosen == Setting(4, 1), served.tuning
    assert [t.setting for t in served.tuning.trials] == [DEFAULT, Setting(4, 1), Setting(2, 2)]
    assert [g.count for g in served.config.instance_group] == [4]
    assert served.config.parameters["intra_op_thread_count"].string_value == "1"
    assert len(served.batcher.pool.instances) == 4
    loaded_with = [threads for kind, _, threads in log if kind == "load"][-4:]
    assert loaded_with == ["1"] * 4, "the serving instances run one thread each"
    await registry.close()


async def test_a_model_left_on_the_cpu_of_a_gpu_machine_says_so_once(
    tmp_path: Path,
    log: list[tuple[str, int, str]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The CPU build of onnxruntime cannot use the machine's GPUs: the measurement and the
    load both place the model on the CPU, and the user is told once, not once for each."""
    monkeypatch.setattr(placing, "gpu_count", lambda: 2)
    registry = _registry(tmp_path, log)
    with caplog.at_level(logging.WARNING, logger=placing.__name__):
        await registry.load("fake")
    served = registry.get("fake")
    assert served.tuning is not None  # measured: placed twice
    assert {i.backend.device for i in served.batcher.pool.instances} == {CPU}
    said = [r for r in caplog.records if r.name == placing.__name__]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "CUDAExecutionProvider" in said[0].getMessage()
    await registry.close()


async def test_a_reload_of_the_same_config_keeps_the_choice_and_measures_nothing(
    tmp_path: Path, log: list[tuple[str, int, str]]
) -> None:
    registry = _registry(tmp_path, log)
    await registry.load("fake")
    served, loads = registry.get("fake"), _loads(log)
    await registry.load("fake")
    assert registry.get("fake") is served
    assert _loads(log) == loads
    changed = LoadOverride(config=fake_config(max_batch_size=8))
    await registry.load("fake", changed)
    assert registry.get("fake") is not served, "another config is measured and loaded anew"
    assert registry.get("fake").tuning is not None
    assert _loads(log) > loads
    await registry.close()


async def test_a_config_that_chose_or_a_single_core_is_not_measured(
    tmp_path: Path, log: list[tuple[str, int, str]]
) -> None:
    registry = _registry(tmp_path, log)
    chosen = LoadOverride(config=fake_config("instance_group [{ count: 2 }]"))
    await registry.load("fake", chosen)
    assert registry.get("fake").tuning is None
    assert _loads(log) == 2
    await registry.close()
    one_core = _registry(tmp_path, log, cpus=1)
    await one_core.load("fake")
    tuning = one_core.get("fake").tuning
    assert tuning is not None
    assert (tuning.chosen, tuning.trials) == (DEFAULT, ())
    assert len(one_core.get("fake").batcher.pool.instances) == 1
    await one_core.close()


async def test_a_count_set_later_replaces_what_was_measured(
    tmp_path: Path, log: list[tuple[str, int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measured_defaults, "light_sample_ns", lambda: 1e12)  # light: the default
    registry = _registry(tmp_path, log)
    await registry.load("fake")
    served = registry.get("fake")
    assert served.tuning is not None
    assert served.tuning.chosen == DEFAULT
    await registry.load(
        "fake", LoadOverride(config=fake_config("instance_group [{ count: 2 }]", max_batch_size=16))
    )
    assert registry.get("fake") is served, "only the instances changed"
    assert served.tuning is None
    assert len(served.batcher.pool.instances) == 2
    await registry.close()
