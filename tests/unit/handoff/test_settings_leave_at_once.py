"""A settings or repository change is on its way to every worker before the call that made
it returns.

The client's answer leaves on another socket (the worker's forwarded HTTP or gRPC call) as
soon as the update returns. A frame queued for the end of this loop pass would be written
after it, and a client's next request could reach a worker that has not read it: under
load a request went untraced just after tracing was switched on. So the test reads the
worker's end of a real socket with no loop pass in between.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import cast

import pytest
from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.engine_link import EngineLink
from batchserve.dataplane.handoff.frames import Frame, FrameProtocol
from batchserve.dataplane.plane import DataPlane
from batchserve.models.registry import ModelRegistry
from batchserve.observability.refusals import REFUSALS
from batchserve.runtime.worker_counts import WorkerCounts
from batchserve.runtime.worker_pool import Endpoints, WorkerPool, _Worker
from fakes import FakeBackend

from tests.unit.rest.test_rest_app import _budgets, _repository

TOKEN = "Bearer t0ken"


pytestmark = pytest.mark.usefixtures("own_logging")


def _written(peer: socket.socket) -> list[Frame]:
    """The frames already in the worker's end of the socket, without waiting."""
    try:
        data = peer.recv(1 << 16)
    except BlockingIOError:
        return []
    frames: list[Frame] = []
    FrameProtocol(frames.append, lambda: None).data_received(data)
    return frames


def test_settings_and_repository_changes_are_written_to_every_worker_before_returning(
    tmp_path: Path,
) -> None:
    async def run() -> tuple[list[list[Frame]], list[list[Frame]], list[list[Frame]]]:
        loop = asyncio.get_running_loop()
        settings = Settings(model_repository=tmp_path, control_token="t0ken")
        registry = ModelRegistry(
            _repository(tmp_path), 8, _budgets(), lambda config, path: FakeBackend()
        )
        plane = DataPlane(settings, registry, [])
        counts = WorkerCounts(REFUSALS)
        pool = WorkerPool(settings, plane, 2, Endpoints(0, 0, "", ""), counts)
        peers = []
        for index in range(2):
            ours, theirs = socket.socketpair()
            theirs.setblocking(False)
            link = EngineLink(
                index, plane, Arena.create("r", 1 << 16), Arena.create("s", 1 << 16),
                counts.update,
            )  # fmt: skip
            await loop.connect_accepted_socket(lambda link=link: link.protocol, ours)
            pool.workers[index] = _Worker(cast(asyncio.subprocess.Process, None), link)
            peers.append(theirs)
        plane.control.trace_settings("", TOKEN, {"trace_level": ["TIMESTAMPS"]})
        traced = [_written(peer) for peer in peers]  # no await since the update
        plane.control.log_settings(TOKEN, {"log_verbose_level": 2})
        logged = [_written(peer) for peer in peers]
        pool.repository_changed()  # as a load calls it, before its answer
        changed = [_written(peer) for peer in peers]
        for worker in pool.workers.values():
            worker.link.protocol.close()
        for peer in peers:
            peer.close()
        return traced, logged, changed

    traced, logged, changed = asyncio.run(run())
    for frames in traced:
        assert [frame[0] for frame in frames] == ["t"]
        assert frames[0][1][0]["trace_level"] == "TIMESTAMPS"
    for frames in logged:
        assert [frame[0] for frame in frames] == ["l"]
        assert frames[0][1]["log_verbose_level"] == 2
    assert changed == [[("v",)], [("v",)]]
