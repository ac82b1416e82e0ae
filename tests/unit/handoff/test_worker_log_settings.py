"""Log settings a client changes reach every worker: the model-owning process passes each
update on, and a worker applies what it is sent."""

from __future__ import annotations

import asyncio

import pytest
from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.frames import pack_frame
from batchserve.dataplane.handoff.worker_plane import WorkerPlane
from batchserve.observability import log_settings

pytestmark = pytest.mark.usefixtures("own_logging")


def test_every_update_is_passed_to_the_followers() -> None:
    seen: list[log_settings.Answer] = []
    log_settings.follow(seen.append)
    log_settings.update({"log_verbose_level": 3})
    assert seen[-1]["log_verbose_level"] == 3
    assert seen[-1] == log_settings.get()


def test_a_worker_applies_the_settings_it_is_sent() -> None:
    async def run() -> log_settings.Answer:
        plane = WorkerPlane(Settings(), Arena.create("r", 1 << 16), Arena.create("s", 1 << 16))
        sent = {**log_settings.get(), "log_info": False, "log_verbose_level": 7}
        plane.protocol.data_received(pack_frame(("l", sent)))
        return log_settings.get()

    applied = asyncio.run(run())
    assert applied["log_info"] is False
    assert applied["log_verbose_level"] == 7
