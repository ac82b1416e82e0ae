"""Triton's poll mode: what a read of the repository finds changed, and what the poller asks
of the registry for it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from batchserve.core.errors import ModelConfigError
from batchserve.core.settings import Settings
from batchserve.models.repository import ModelRepository
from batchserve.models.repository_poll import RepositoryPoller, changes, snapshot
from pydantic import ValidationError


def _model(root: Path, name: str, version: int = 1) -> Path:
    directory = root / name / str(version)
    directory.mkdir(parents=True)
    (directory / "model.onnx").write_bytes(b"weights")
    return root / name


def test_added_changed_and_removed_models_are_told_apart(tmp_path: Path) -> None:
    repository = ModelRepository(tmp_path)
    kept, touched, removed = (_model(tmp_path, n) for n in ("kept", "touched", "removed"))
    before = snapshot(repository)
    _model(tmp_path, "added")
    (touched / "1" / "model.onnx").write_bytes(b"other weights")
    shutil.rmtree(removed)
    (tmp_path / ".hidden").mkdir()  # not a model directory, as at start
    assert changes(before, snapshot(repository)) == (["added", "touched"], ["removed"])
    assert kept.exists()


def test_a_file_of_the_same_size_but_a_new_time_is_a_change(tmp_path: Path) -> None:
    """Triton compares modification times: a file rewritten in place counts."""
    model = _model(tmp_path, "m")
    repository = ModelRepository(tmp_path)
    before = snapshot(repository)
    stat = (model / "1" / "model.onnx").stat()
    os.utime(model / "1" / "model.onnx", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert changes(before, snapshot(repository)) == (["m"], [])
    (model / "2").mkdir()  # an empty directory adds no file: no change
    assert changes(snapshot(repository), snapshot(repository)) == ([], [])


def test_a_model_copied_into_a_second_repository_is_unloaded_and_tried_again(
    tmp_path: Path,
) -> None:
    """Triton unloads a model once two repositories hold it; its load then fails with
    Triton's reason, and removing the copy brings it back."""
    first, second = tmp_path / "first", tmp_path / "second"
    _model(first, "m")
    second.mkdir()
    repository = ModelRepository([first, second])
    before = snapshot(repository)
    shutil.copytree(first / "m", second / "m")
    duplicated = snapshot(repository)
    assert len(duplicated["m"]) == 2
    assert changes(before, duplicated) == (["m"], ["m"])
    shutil.rmtree(second / "m")
    assert changes(duplicated, snapshot(repository)) == (["m"], [])


def test_the_poller_unloads_then_loads_and_goes_on_after_a_failed_load(tmp_path: Path) -> None:
    _model(tmp_path, "gone")
    _model(tmp_path, "stays")
    asked: list[tuple[str, str]] = []

    async def load(name: str) -> None:
        asked.append(("load", name))
        if name == "broken":
            raise ModelConfigError("broken/config.pbtxt: no")

    async def unload(name: str) -> None:
        asked.append(("unload", name))

    async def scenario() -> None:
        poller = RepositoryPoller(ModelRepository(tmp_path), load, unload, interval_s=60)
        await poller.start()
        await poller.poll()
        assert asked == []  # nothing changed since the start
        shutil.rmtree(tmp_path / "gone")
        _model(tmp_path, "broken")
        _model(tmp_path, "new")
        await poller.poll()
        assert asked == [("unload", "gone"), ("load", "broken"), ("load", "new")]
        asked.clear()
        await poller.poll()
        assert asked == [], "a failed load is tried again only once its files change"

    asyncio.run(scenario())


@pytest.mark.parametrize("seconds", ["-1", "86401"])
def test_the_poll_interval_is_bounded(seconds: str) -> None:
    with pytest.raises(ValidationError, match="repository_poll_secs"):
        Settings(repository_poll_secs=seconds)
