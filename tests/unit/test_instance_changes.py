"""A load that changes only ``instance_group`` changes the served version's instances in
place, as Triton does: the version, its statistics and its other instances carry on; new
instances are reserved in the memory budget before anything changes."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import CPU
from batchserve.core.errors import ModelConfigError, NotFound, OutOfMemory
from batchserve.devices.placement import Placement, resolve_placements
from batchserve.models import instance_loader
from batchserve.models.instance_change import only_instances_differ, plan_instances
from batchserve.models.load_override import LoadOverride
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.model_table import InstanceMemory, LoadedInstance, ModelState, ServedVersion
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.instances import Instance
from batchserve.scheduler.memory import MemoryBudgets, MemoryProfile, MemorySample, Reservation
from batchserve.scheduler.work import Arrays, WorkItem
from fakes import FAKE_CONFIG, FakeBackend, fake_config
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
KIB = 1024
PROFILE = MemoryProfile(
    100 * KIB, 100 * KIB, (MemorySample(1, 200 * KIB, 1000), MemorySample(8, 900 * KIB, 4000))
)
"""What every fake instance is measured to need: 100 KiB, and 100 KiB per sample."""


def _fake_probe(backend: Any, model_file: Path, config: ModelConfig, device: Any, **_: Any) -> Any:
    backend.load(model_file, config, device)
    return PROFILE


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> list[FakeBackend]:
    """Every backend the registry makes, in order; each measured as ``PROFILE``."""
    monkeypatch.setattr(instance_loader, "probe_backend", _fake_probe)
    return []


def _registry(root: Path, backends: list[FakeBackend], budget: str | None = None) -> Any:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG)
    changes: list[str] = []

    def backend(*_: Any) -> FakeBackend:
        backends.append(FakeBackend())
        return backends[-1]

    budgets = MemoryBudgets(parse_budgets(budget), device_total_bytes)
    registry = ModelRegistry(
        ModelRepository(root), 8, budgets, backend, after_change=lambda: changes.append("v")
    )
    return registry, changes


def _with_count(count: int, extra: str = "", **fields: int) -> LoadOverride:
    """The fake model's config with ``count`` CPU instances (a load's config parameter)."""
    groups = f"instance_group [{{ kind: KIND_CPU count: {count} }}]\n"
    return LoadOverride(config=fake_config(groups + extra, **fields))


def _instances(registry: ModelRegistry) -> list[str]:
    return [i.name for i in registry.get("fake").batcher.pool.instances]


async def test_a_count_change_keeps_the_version_its_statistics_and_its_instances(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    registry, changes = _registry(tmp_path, backends)
    await registry.load("fake", _with_count(1))
    served = registry.get("fake")
    served.stats.success.add(5)
    await registry.load("fake", _with_count(3))
    assert registry.get("fake") is served
    assert served.stats.success.count == 1, "statistics carry on"
    assert _instances(registry) == ["fake-1-0", "fake-1-1", "fake-1-2"]
    assert [g.count for g in served.config.instance_group] == [3]
    assert len(backends) == 3
    assert not backends[0].unloaded, "the first instance stayed"
    await registry.load("fake", _with_count(1))
    assert registry.get("fake") is served
    assert _instances(registry) == ["fake-1-0"]
    assert [b.unloaded for b in backends] == [False, True, True]
    assert len(served.memory) == 1
    assert changes == ["v"] * 3, "workers are told each time, to ask for the config again"
    await registry.close()


async def test_removed_instances_give_their_memory_back(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    registry, _ = _registry(tmp_path, backends)
    await registry.load("fake", _with_count(3))
    budget = registry.budgets.for_device(CPU)
    assert budget.holdings() == {"fake": 3 * PROFILE.predict(8)}
    await registry.load("fake", _with_count(1))
    assert budget.holdings() == {"fake": PROFILE.predict(8)}
    assert len(registry.get("fake").reservations.reservations) == 1
    await registry.close()
    assert budget.holdings() == {}


async def test_a_change_that_does_not_fit_is_refused_and_the_model_serves_as_before(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """Two instances fit the 2000 KiB budget (900 KiB each at the cap of 8), a third only at
    one sample (200 KiB), and a fourth not at all: the third is unloaded again."""
    registry, changes = _registry(tmp_path, backends, budget=f"cpu={2000 * KIB}")
    await registry.load("fake", _with_count(2))
    served = registry.get("fake")
    with pytest.raises(OutOfMemory, match=r"needs 200 KiB at batch 1 .* but only 0 B of the cpu"):
        await registry.load("fake", _with_count(4))
    assert registry.get("fake") is served
    assert _instances(registry) == ["fake-1-0", "fake-1-1"]
    assert [g.count for g in served.config.instance_group] == [2]
    assert [b.unloaded for b in backends] == [False, False, True, True]
    assert registry.budgets.for_device(CPU).holdings() == {"fake": 1800 * KIB}
    [row] = registry.index()
    assert (row.state, "of the cpu budget" in row.reason) == (ModelState.READY.value, True)
    assert changes == ["v"], "nothing changed for workers to ask about"
    answer = await _infer(served, np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(answer["y"], np.full((2, 4), 3.0, np.float32))
    await registry.close()


async def _infer(served: ServedVersion, x: np.ndarray) -> Arrays:
    future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
    served.batcher.submit(WorkItem({"x": x}, len(x), ("y",), 1, time.monotonic_ns(), None, future))
    return await asyncio.wait_for(future, 10)


async def test_change_instances_changes_a_ready_model_and_only_its_instances(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """What a caller other than a load uses (choosing instance counts by measurement)."""
    registry, changes = _registry(tmp_path, backends)
    await registry.load("fake")
    served = registry.get("fake")
    wanted = ModelConfig()
    wanted.CopyFrom(served.config)
    wanted.instance_group[0].count = 2
    await registry.change_instances("fake", wanted)
    assert registry.get("fake") is served
    assert (len(_instances(registry)), changes) == (2, ["v", "v"])
    wanted.max_batch_size = 4
    with pytest.raises(ModelConfigError, match="only instance_group may change"):
        await registry.change_instances("fake", wanted)
    with pytest.raises(NotFound):
        await registry.change_instances("absent", wanted)
    await registry.close()


async def test_the_batch_cap_follows_what_the_instances_reserved(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """The model's own budget of 2500 KiB: two instances reserve 900 KiB each (cap 8), a
    third only 700 KiB (cap 6), and the model's cap is the smallest."""
    budget = f"batchserve {{ memory_budget_bytes: {2500 * KIB} }}\n"
    registry, _ = _registry(tmp_path, backends)
    await registry.load("fake", _with_count(2, budget))
    assert registry.get("fake").batcher.cap == 8
    await registry.load("fake", _with_count(3, budget))
    served = registry.get("fake")
    assert [m.batch_cap for m in served.memory] == [8, 8, 6]
    assert (served.batcher.cap, served.batcher.policy.max_batch_size) == (6, 6)
    await registry.load("fake", _with_count(2, budget))
    assert served.batcher.cap == 8
    await registry.close()


async def test_a_load_shares_the_model_budget_evenly_across_its_instances(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """Three instances loaded together under 2500 KiB: each takes its share of what is left
    (833, 850, 900 KiB: caps 7, 7, 8), where taking what each could (the test above) would
    give 8, 8, 6; the model batches at the smallest."""
    budget = f"batchserve {{ memory_budget_bytes: {2500 * KIB} }}\n"
    registry, _ = _registry(tmp_path, backends)
    await registry.load("fake", _with_count(3, budget))
    served = registry.get("fake")
    assert [m.batch_cap for m in served.memory] == [7, 7, 8]
    assert (served.batcher.cap, served.batcher.policy.max_batch_size) == (7, 7)
    await registry.close()


async def test_a_reload_that_fails_leaves_the_loaded_version_serving(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """As Triton: a whole reload (here, of a config changed beyond its instances) that does
    not fit the budget beside the version being served leaves that version serving."""
    registry, _ = _registry(tmp_path, backends, budget=f"cpu={2000 * KIB}")
    await registry.load("fake", _with_count(1))
    served = registry.get("fake")
    with pytest.raises(OutOfMemory):
        await registry.load("fake", _with_count(3, max_batch_size=4))
    assert registry.get("fake") is served
    [row] = registry.index()
    assert (row.state, "of the cpu budget" in row.reason) == (ModelState.READY.value, True)
    assert registry.budgets.for_device(CPU).holdings() == {"fake": 900 * KIB}
    await registry.close()


async def test_a_plain_reload_after_the_file_changed_changes_instances_in_place(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    registry, _ = _registry(tmp_path, backends)
    await registry.load("fake")
    served = registry.get("fake")
    config = tmp_path / "fake" / "config.pbtxt"
    config.write_text(FAKE_CONFIG + "instance_group [{ count: 2 kind: KIND_CPU }]")
    await registry.load("fake")
    assert registry.get("fake") is served
    assert len(_instances(registry)) == 2
    await registry.close()


async def test_any_other_change_reloads_the_model_whole(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    registry, _ = _registry(tmp_path, backends)
    await registry.load("fake", _with_count(1))
    first = registry.get("fake")
    await registry.load("fake", _with_count(2, max_batch_size=4))
    second = registry.get("fake")
    assert second is not first
    assert (second.config.max_batch_size, len(second.memory)) == (4, 2)
    model_file = tmp_path / "fake" / "1" / "model.onnx"
    os.utime(model_file, ns=(1, 1))  # a new model file, as far as times tell
    await registry.load("fake", _with_count(2, max_batch_size=4))
    assert registry.get("fake") is not second
    await registry.close()


async def test_a_sequence_model_is_reloaded_whole(tmp_path: Path) -> None:
    """Its live sequences hold slots of particular instances (runs the real model)."""
    shutil.copytree(MODEL_REPO / "simple_sequence", tmp_path / "simple_sequence")
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(tmp_path), 8, budgets)
    await registry.load("simple_sequence")
    first = registry.get("simple_sequence")
    config = ModelConfig()
    config.CopyFrom(first.config)
    config.instance_group[0].count = 2
    await registry.load("simple_sequence", LoadOverride(config=config))
    second = registry.get("simple_sequence")
    assert second is not first
    assert len(second.memory) == 2
    await registry.close()


# --- the pure parts --------------------------------------------------------------------------


def _loaded(name: str, placement: Placement) -> LoadedInstance:
    memory = InstanceMemory(placement.device, PROFILE, 900, 8)
    return LoadedInstance(Instance(name, FakeBackend()), placement, memory, _no_reservation())


def _no_reservation() -> Reservation:
    budget = MemoryBudgets(parse_budgets(None), lambda _: 1 << 20).for_device(CPU)
    return budget.reserve("fake", PROFILE, 8)


def _placements(groups: str, gpus: int = 0) -> list[Placement]:
    return resolve_placements(parse_pbtxt(f'name: "m"\n{groups}'), gpus)


def test_a_plan_keeps_the_earliest_instances_of_each_placement() -> None:
    [cpu] = set(_placements("instance_group [{ kind: KIND_CPU count: 3 }]"))
    current = [_loaded(f"m-{n}", cpu) for n in range(3)]
    plan = plan_instances(current, _placements("instance_group [{ kind: KIND_CPU count: 1 }]"))
    assert ([i.instance.name for i in plan.keep], plan.add) == (["m-0"], ())
    assert [i.instance.name for i in plan.remove] == ["m-1", "m-2"]
    grown = plan_instances(current, _placements("instance_group [{ kind: KIND_CPU count: 5 }]"))
    assert (len(grown.keep), len(grown.add), grown.remove) == (3, 2, ())


def test_a_plan_replaces_instances_whose_group_settings_changed() -> None:
    """Triton's instance signature: the group's settings but name and count, and the device."""
    gpus = _placements("instance_group [{ kind: KIND_GPU count: 1 gpus: [0, 1] }]", gpus=2)
    current = [_loaded(f"m-{n}", p) for n, p in enumerate(gpus)]
    one = _placements("instance_group [{ kind: KIND_GPU count: 1 gpus: [1] }]", gpus=2)
    plan = plan_instances(current, one)
    assert (plan.keep, len(plan.add), len(plan.remove)) == ((), 1, 2)
    renamed = _placements(
        "instance_group [{ name: 'other' kind: KIND_GPU count: 2 gpus: [0, 1] }]", gpus=2
    )
    plan = plan_instances(current, renamed)
    assert (len(plan.keep), len(plan.add), plan.remove) == (2, 2, ())


def test_only_instance_groups_and_the_version_policy_may_differ() -> None:
    base = fake_config()
    assert only_instances_differ(base, fake_config("instance_group [{ count: 4 }]"))
    assert only_instances_differ(base, fake_config("version_policy { all {} }"))
    assert not only_instances_differ(base, fake_config(max_batch_size=4))


async def test_a_count_the_budget_can_never_hold_is_refused_without_loading_them_all(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """1 -> 100000 instances of 200 KiB each at batch 1 in a 64 MiB budget: refused once two
    are measured (the one serving and the first added), and the version serves on as before."""
    registry, _ = _registry(tmp_path, backends, "cpu=64MiB")
    await registry.load("fake")
    served = registry.get("fake")
    wanted = ModelConfig()
    wanted.CopyFrom(served.config)
    wanted.instance_group[0].count = 100_000
    with pytest.raises(ModelConfigError, match="99998 more instance\\(s\\) on cpu need at least"):
        await registry.change_instances("fake", wanted)
    assert len(backends) == 2
    assert registry.get("fake") is served
    assert len(_instances(registry)) == 1
    await registry.close()


async def test_a_passive_instance_is_loaded_and_runs_nothing_until_unloaded(
    tmp_path: Path, backends: list[FakeBackend]
) -> None:
    """Triton's passive: true (L0_passive_instance): loaded and warmed up, given no
    requests; it used to run batches like any other. A count change reloads whole."""
    registry, _ = _registry(tmp_path, backends)
    groups = (
        "instance_group [{ kind: KIND_CPU count: 1 }, { kind: KIND_CPU count: 1 passive: true }]\n"
    )
    await registry.load("fake", LoadOverride(config=fake_config(groups)))
    served = registry.get("fake")
    assert _instances(registry) == ["fake-1-0"]
    assert len(served.instances) == len(backends) == 2
    for _ in range(4):
        item = WorkItem(
            {"x": np.ones((1, 4), np.float32)}, 1, ("y",), 1, time.monotonic_ns(), None,
            asyncio.get_running_loop().create_future(),
        )  # fmt: skip
        served.batcher.submit(item)
        await item.future
    assert backends[0].batches
    assert not backends[1].batches
    await registry.unload("fake")
    assert [b.unloaded for b in backends] == [True, True]


def test_a_config_whose_every_instance_is_passive_is_refused() -> None:
    from batchserve.models.config_validation import config_problems

    config = fake_config("instance_group [{ kind: KIND_CPU count: 2 passive: true }]\n")
    problems = config_problems(config, source="fake/config.pbtxt", directory="fake")
    assert any("every instance_group is passive" in p for p in problems), problems
