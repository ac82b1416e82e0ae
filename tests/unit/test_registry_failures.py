"""A model whose files are broken: clients asking for it are told why, not just "not loaded"."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.errors import BackendError, ModelConfigError, NotFound, Unavailable
from batchserve.models.load_override import LoadOverride
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_table import ModelState
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FAKE_CONFIG, FakeBackend
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio


def _registry(root: Path, backend: type[FakeBackend] = FakeBackend) -> ModelRegistry:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG)
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    return ModelRegistry(ModelRepository(root), 8, budgets, lambda *_: backend())


def _corrupt(root: Path) -> None:
    path = root / "fake" / "1" / "model.onnx"
    path.write_bytes(path.read_bytes()[:40] + b"\xff" * 40)


async def test_a_model_that_cannot_be_read_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    _corrupt(tmp_path)
    with pytest.raises(ModelConfigError) as failure:
        await registry.load("fake")
    with pytest.raises(Unavailable) as refused:
        registry.get("fake")
    assert failure.value.message in refused.value.message
    assert [(r.name, r.state, r.reason) for r in registry.index()] == [
        ("fake", ModelState.UNAVAILABLE.value, failure.value.message)
    ]


async def test_a_failed_reload_keeps_the_loaded_version_serving(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    await registry.load("fake")
    _corrupt(tmp_path)
    with pytest.raises(ModelConfigError):
        await registry.load("fake")
    assert registry.get("fake").version == 1
    await registry.close()


async def test_an_unknown_name_leaves_no_trace(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    with pytest.raises(NotFound):
        await registry.load("absent")
    assert [r.name for r in registry.index()] == ["fake"]
    with pytest.raises(NotFound):
        registry.get("absent")


class _FailsOnThreeRows(FakeBackend):
    def infer(self, inputs, output_names=None):  # type: ignore[no-untyped-def]
        if len(inputs["x"]) == 3:
            raise BackendError("three rows are too many")
        return super().infer(inputs, output_names)


async def test_a_failing_warmup_sample_is_named_in_the_reason(tmp_path: Path) -> None:
    registry = _registry(tmp_path, _FailsOnThreeRows)
    config = tmp_path / "fake" / "config.pbtxt"
    config.write_text(
        FAKE_CONFIG + 'model_warmup [{ name: "three" batch_size: 3 inputs { key: "x" '
        "value: { data_type: TYPE_FP32 dims: [4] zero_data: true } } }]"
    )
    with pytest.raises(ModelConfigError) as failure:
        await registry.load("fake")
    assert failure.value.message == (  # Triton's words for a version's failed load
        "version 1 is at UNAVAILABLE state: Invalid argument: failed to run warmup sample "
        "'three': three rows are too many;"
    )
    assert [r.state for r in registry.index()] == [ModelState.UNAVAILABLE.value]


class _NumpyCannotAllocate(FakeBackend):
    """Fails as numpy does when a batch's inputs cannot be allocated: not batchserve's error."""

    def infer(self, inputs, output_names=None):  # type: ignore[no-untyped-def]
        raise MemoryError("Unable to allocate 29.1 TiB for an array with shape (8, 10**12)")


async def test_an_error_that_is_not_batchserves_fails_the_load_not_the_registry(
    tmp_path: Path,
) -> None:
    """It used to escape the registry (a server starting up exited) and leave the model
    LOADING; a failed reload must still leave the version loaded before serving."""
    registry = _registry(tmp_path, _NumpyCannotAllocate)
    with pytest.raises(BackendError) as failure:
        await registry.load("fake")
    assert failure.value.message == (
        "version 1 is at UNAVAILABLE state: Internal: model 'fake' failed to load: MemoryError: "
        "Unable to allocate 29.1 TiB for an array with shape (8, 10**12);"
    )
    assert isinstance(failure.value.__cause__, MemoryError)
    assert [(r.state, r.reason) for r in registry.index()] == [
        (ModelState.UNAVAILABLE.value, failure.value.message)
    ]
    serving = _registry(tmp_path / "again")
    await serving.load("fake")
    serving._loader.backend_factory = lambda *_: _NumpyCannotAllocate()
    changed = FAKE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 4")  # a whole reload
    (tmp_path / "again" / "fake" / "config.pbtxt").write_text(changed)
    with pytest.raises(BackendError, match="MemoryError"):
        await serving.load("fake")
    assert serving.get("fake").version == 1
    assert [r.state for r in serving.index()] == [ModelState.READY.value]
    await serving.close()


async def test_a_repository_read_that_fails_unforeseen_fails_that_load_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error reading the files that is not batchserve's (a directory removed while it is
    read, say) used to escape the registry and stop a server starting up."""
    registry = _registry(tmp_path)

    def removed_meanwhile(name: str, config: object = None) -> Any:
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / name / "1"))

    monkeypatch.setattr(registry.repository, "resolve", removed_meanwhile)
    with pytest.raises(BackendError) as failure:
        await registry.load("fake")
    assert failure.value.message == (
        "model 'fake' failed to load: FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{tmp_path / 'fake' / '1'}'"
    )
    assert [(r.name, r.state, r.reason) for r in registry.index()] == [
        ("fake", ModelState.UNAVAILABLE.value, failure.value.message)
    ]
    monkeypatch.undo()  # the files back: the next load serves
    await registry.load("fake")
    assert [r.state for r in registry.index()] == [ModelState.READY.value]
    await registry.close()


async def test_a_load_cancelled_while_its_files_are_written_leaves_none_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that gives up (a gRPC deadline) while the load's files are being written:
    the thread still writes them, and they are removed once it has."""
    registry = _registry(tmp_path / "repo")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    writing, release, written = threading.Event(), threading.Event(), threading.Event()
    resolve = registry._resolve

    def slow_resolve(name: str, override: LoadOverride | None) -> Any:
        writing.set()
        release.wait(10)
        try:
            return resolve(name, override)
        finally:
            written.set()

    monkeypatch.setattr(registry, "_resolve", slow_resolve)
    files = {PurePosixPath(p.relative_to(tmp_path / "repo" / "fake")): p.read_bytes()
             for p in (tmp_path / "repo" / "fake").rglob("*") if p.is_file()}  # fmt: skip
    override = LoadOverride(config=registry.repository.resolve("fake").config, files=files)
    load = asyncio.ensure_future(registry.load("fake", override))
    await asyncio.to_thread(writing.wait, 10)
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await load
    release.set()
    await asyncio.to_thread(written.wait, 10)
    assert written.is_set()
    for _ in range(200):  # the thread has written the files; they are removed next
        if not any(scratch.iterdir()):
            break
        await asyncio.sleep(0.02)
    assert list(scratch.iterdir()) == []
    assert registry.index()[0].state != ModelState.READY.value
