"""The model-owning process counts the request frames it reads where the worker sees them,
and writes to the worker about it only while the worker holds requests."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.engine_link import EngineLink
from batchserve.dataplane.handoff.errors import error_from
from batchserve.dataplane.handoff.frames import Frame, FrameProtocol, pack_frame
from batchserve.dataplane.handoff.read_mark import ReadMark
from batchserve.dataplane.plane import DataPlane
from batchserve.models.registry import ModelRegistry
from fakes import FakeBackend

from tests.unit.rest.test_rest_app import _budgets, _repository

pytestmark = pytest.mark.usefixtures("own_logging")


async def _read_twice(tmp_path: Path, holding: bool) -> tuple[int, list[Frame]]:
    """Two request frames this process cannot read, sent in one write by a worker that
    holds requests (``holding``) or not: the count there, and what came back."""
    loop = asyncio.get_running_loop()
    registry = ModelRegistry(_repository(tmp_path), 8, _budgets(), lambda c, p: FakeBackend())
    plane = DataPlane(Settings(model_repository=tmp_path), registry, [])
    requests = Arena.create("r", 1 << 16)
    link = EngineLink(0, plane, requests, Arena.create("s", 1 << 16), lambda i, f: None)
    ours, theirs = socket.socketpair()
    await loop.connect_accepted_socket(lambda: link.protocol, ours)
    worker = ReadMark(requests)
    if holding:
        assert worker.hold(2), "two sent, none read: the worker holds"
    theirs.sendall(pack_frame(("g",)) + pack_frame(("i",)))  # malformed, both, and no id
    for _ in range(500):
        if worker.read == 2:
            break
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.01)  # any answer has been written by now
    theirs.setblocking(False)
    try:
        data = theirs.recv(1 << 16)
    except BlockingIOError:
        data = b""
    back: list[Frame] = []
    FrameProtocol(back.append, lambda: None).data_received(data)
    link.protocol.close()
    theirs.close()
    return worker.read, back


def test_frames_it_cannot_read_are_still_counted_and_a_holding_worker_is_told(
    tmp_path: Path,
) -> None:
    read, back = asyncio.run(_read_twice(tmp_path, holding=True))
    assert read == 2, "a worker holding requests would otherwise wait for ever"
    assert back == [("k",)]


def test_a_worker_that_holds_nothing_is_not_written_to(tmp_path: Path) -> None:
    read, back = asyncio.run(_read_twice(tmp_path, holding=False))
    assert read == 2
    assert back == [], "no frame: a sleeping worker stays asleep"


async def _answer_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Frame]:
    """A request frame whose handling fails with an error that is not batchserve's."""
    loop = asyncio.get_running_loop()
    registry = ModelRegistry(_repository(tmp_path), 8, _budgets(), lambda c, p: FakeBackend())
    plane = DataPlane(Settings(model_repository=tmp_path), registry, [])
    link = EngineLink(
        0, plane, Arena.create("r", 1 << 16), Arena.create("s", 1 << 16), lambda i, f: None
    )

    def unforeseen(*args: object) -> None:
        raise ValueError("invalid literal for int() with base 10: '\u00b2'")

    monkeypatch.setattr(link, "_request", unforeseen)
    ours, theirs = socket.socketpair()
    await loop.connect_accepted_socket(lambda: link.protocol, ours)
    frame = ("i", 7, "fake", "\u00b2", "", "http", 0, 0, None, None, b"", [], None, None, None,
             False)  # fmt: skip
    theirs.sendall(pack_frame(frame))
    theirs.settimeout(5)
    back: list[Frame] = []
    receiver = FrameProtocol(back.append, lambda: None)
    while not back:
        receiver.data_received(await loop.run_in_executor(None, theirs.recv, 1 << 16))
    link.protocol.close()
    theirs.close()
    return back


def test_a_request_that_fails_unforeseen_is_answered_not_left_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to be logged as a frame not understood and never answered: the worker's
    client waited for ever."""
    back = asyncio.run(_answer_to(tmp_path, monkeypatch))
    assert len(back) == 1
    tag, rid, *error = back[0]
    assert (tag, rid) == ("e", 7)
    assert error_from(*error).message == "internal error: ValueError"
