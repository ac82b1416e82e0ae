"""Lookup by name and version: which version a request gets, and Triton's texts when none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from batchserve.core.errors import InvalidArgument, NotFound, Unavailable, VersionRetired
from batchserve.models.model_table import IndexEntry, ModelState, ModelTable
from batchserve.models.repository import ModelRepository


def _table(
    root: Path, **versions: tuple[int, ...]
) -> tuple[ModelTable, dict[tuple[str, int], Any]]:
    """A table serving ``versions`` of each named model; each version a distinct stand-in."""
    table = ModelTable(ModelRepository(root))
    served: dict[tuple[str, int], Any] = {}
    for name, numbers in versions.items():
        entry = table._entry(name)
        entry.state = ModelState.READY
        for number in numbers:
            entry.versions[number] = served[name, number] = object()
    return table, served


def test_no_version_asked_for_is_the_highest_served(tmp_path: Path) -> None:
    table, served = _table(tmp_path, m=(3, 1, 2))
    assert table.get("m") is served["m", 3]
    assert table.get("m", "1") is served["m", 1]
    assert table.versions_of("m") == [served["m", 1], served["m", 2], served["m", 3]]


def test_a_version_not_served_or_not_a_number_is_refused(tmp_path: Path) -> None:
    table, _ = _table(tmp_path, m=(1,))
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'm' version 2 is not found"):
        table.get("m", "2")
    with pytest.raises(InvalidArgument, match="a version is a positive integer"):
        table.get("m", "latest")
    # str.isdigit takes these; int() refused the first (a 500) and read the second as 1
    for digits in ("\u00b2", "\u0661"):
        with pytest.raises(InvalidArgument, match="a version is a positive integer"):
            table.get("m", digits)
    with pytest.raises(NotFound, match="is not found"):  # past int()'s 4300-digit limit
        table.get("m", "9" * 4301)
    assert not table.is_ready("m", "2")
    assert table.is_ready("m", "1")


def test_a_model_in_the_repository_but_not_loaded_is_unavailable_not_unknown(
    tmp_path: Path,
) -> None:
    (tmp_path / "on_disk").mkdir()
    table, _ = _table(tmp_path)
    with pytest.raises(Unavailable, match=r"'on_disk' has no available versions.*is not loaded"):
        table.get("on_disk")
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'nowhere' is not found"):
        table.get("nowhere")
    assert table.knows("on_disk")
    assert not table.knows("nowhere")


def test_a_model_not_ready_says_its_state_and_reason(tmp_path: Path) -> None:
    table, _ = _table(tmp_path, m=(1,))
    entry = table._entry("m")
    entry.state, entry.reason = ModelState.UNAVAILABLE, "it broke"
    with pytest.raises(Unavailable, match=r"is not ready \(UNAVAILABLE: it broke\)"):
        table.get("m")
    assert table.loaded() != []  # its versions stay listed until unloaded


def test_the_index_lists_the_repository_and_every_loaded_version(tmp_path: Path) -> None:
    (tmp_path / "b_on_disk").mkdir()
    table, served = _table(tmp_path, a=(1, 2), c=(5,))
    assert table.index() == [
        IndexEntry("a", "1", "READY", ""),
        IndexEntry("a", "2", "READY", ""),
        IndexEntry("b_on_disk", "", "", ""),  # never loaded: its name alone, as Triton
        IndexEntry("c", "5", "READY", ""),
    ]
    assert [row.name for row in table.index(ready_only=True)] == ["a", "a", "c"]
    assert table.loaded() == [served["a", 1], served["a", 2], served["c", 5]]


def test_the_index_lists_a_model_of_two_repositories_once_unavailable(tmp_path: Path) -> None:
    """Triton's one row for a duplicate, whatever was loaded under its name before."""
    for root in ("first", "second"):
        (tmp_path / root / "twice").mkdir(parents=True)
    (tmp_path / "second" / "once").mkdir()
    table = ModelTable(ModelRepository([tmp_path / "first", tmp_path / "second"]))
    entry = table._entry("twice")
    entry.state, entry.versions[1] = ModelState.READY, object()  # type: ignore[assignment]
    assert table.index() == [
        IndexEntry("once", "", "", ""),
        IndexEntry("twice", "", "UNAVAILABLE", "model appears in two or more repositories"),
    ]
    assert table.knows("once")


@pytest.mark.parametrize(
    ("state", "reason", "ready"),
    [
        (ModelState.READY, "", True),
        (ModelState.UNAVAILABLE, "unloaded", True),  # unloaded on request: Triton's exception
        (ModelState.UNAVAILABLE, "m/config.pbtxt: bad dims", False),
        (ModelState.LOADING, "", False),
        (ModelState.UNLOADING, "", False),
    ],
)
def test_strict_readiness_asks_every_model_tried(
    tmp_path: Path, state: ModelState, reason: str, ready: bool
) -> None:
    table, _ = _table(tmp_path, m=(1,), other=(1,))
    entry = table._entry("other")
    entry.state, entry.reason = state, reason
    assert table.all_ready(["m"]) is ready
    assert table.all_ready(["m", "never_tried"]) is False, "a start-up model not yet tried"


def test_a_version_served_once_is_not_at_ready_state_and_listed_unloaded(tmp_path: Path) -> None:
    """Triton keeps a version it served, UNAVAILABLE, once a later load leaves it out or the
    model is unloaded: its index lists it "unloaded" and a request for it is UNAVAILABLE
    "not at ready state", where a version never served is NOT_FOUND."""
    table, served = _table(tmp_path, m=(1,))
    entry = table._entry("m")
    assert entry.replace_versions({3: served["m", 1]}) == {1: served["m", 1]}
    assert table.index() == [
        IndexEntry("m", "1", "UNAVAILABLE", "unloaded"),
        IndexEntry("m", "3", "READY", ""),
    ]
    assert table.index(ready_only=True) == [IndexEntry("m", "3", "READY", "")]
    with pytest.raises(
        VersionRetired, match=r"^Request for unknown model: 'm' version 1 is not at ready state "
    ):
        table.get("m", "1")
    with pytest.raises(NotFound, match="version 2 is not found"):
        table.get("m", "2")
    assert table.get("m") is served["m", 1]
    entry.replace_versions({1: served["m", 1]})  # served again: no longer retired
    assert [row.version for row in table.index()] == ["1", "3"]
    assert table.is_ready("m", "1")
    assert not table.is_ready("m", "3")
    entry.replace_versions({})  # unloaded
    entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
    assert table.index() == [
        IndexEntry("m", "1", "UNAVAILABLE", "unloaded"),
        IndexEntry("m", "3", "UNAVAILABLE", "unloaded"),
    ]
    with pytest.raises(Unavailable, match="'m' has no available versions"):
        table.get("m")
    entry.state, entry.reason = ModelState.UNAVAILABLE, "m/config.pbtxt: bad dims"
    assert table.index()[0] == IndexEntry("m", "1", "UNAVAILABLE", "m/config.pbtxt: bad dims")


def test_a_version_of_a_model_not_ready_is_not_at_ready_state(tmp_path: Path) -> None:
    table, _ = _table(tmp_path, m=(2,))
    entry = table._entry("m")
    entry.state = ModelState.UNLOADING
    with pytest.raises(Unavailable, match=r"version 2 is not at ready state .*UNLOADING"):
        table.get("m", "2")
    with pytest.raises(InvalidArgument, match="a version is a positive integer"):
        table.get("m", "two")  # the version is read first, as Triton reads it
