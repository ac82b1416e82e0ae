"""The sweep for orphans, over real child processes named as batchserve names its own (a copy
of ``sleep`` under that name: the kernel names a process after its executable): it reaps the
unclaimed zombies carrying a batchserve name, leaves claimed ones and others' children to
their waiters, and sweeps again while an unclaimed one still runs."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from batchserve.runtime.orphans import Orphans

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux)")

NAMES = ("bs-fork-server", "bs-worker-")


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie); None once it has been reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[0]
    except FileNotFoundError:
        return None


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _named(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", path)
    return str(path)


def test_a_sweep_reaps_only_unclaimed_zombies_with_batchserve_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="batchserve.runtime.orphans")
    orphan = subprocess.Popen([_named(tmp_path, "bs-worker-1"), "0"])
    claimed = subprocess.Popen([_named(tmp_path, "bs-worker-2"), "0"])
    others = subprocess.Popen([_named(tmp_path, "sleep"), "0"])
    running = subprocess.Popen([_named(tmp_path, "bs-fork-server"), "0.5"])
    exited = (orphan, claimed, others)
    try:
        _until(lambda: all(_state(p.pid) == "Z" for p in exited))
        assert [_state(p.pid) for p in exited] == ["Z"] * 3
        heard: list[int] = []
        orphans = Orphans(NAMES, lambda: heard.append(len(heard)))
        orphans.claim(claimed.pid)

        assert orphans.sweep() is True  # the one still running is an orphan still to reap
        assert heard == [0]  # what is on its way is heard before anything is judged
        assert _state(orphan.pid) is None
        reaped = [(r.pid, r.process_name) for r in caplog.records]  # type: ignore[attr-defined]
        assert reaped == [(orphan.pid, "bs-worker-1")]
        assert _state(claimed.pid) == "Z"  # its waiter's to reap
        assert _state(others.pid) == "Z"  # not one of ours
        assert _state(running.pid) not in (None, "Z")

        async def sweep_until_none_runs() -> None:
            orphans.sweep_soon()
            for _ in range(300):
                if _state(running.pid) is None:
                    break
                await asyncio.sleep(0.01)
            orphans.close()

        asyncio.run(sweep_until_none_runs())
        assert _state(running.pid) is None  # reaped by a later sweep, once it had exited
        orphans.release(claimed.pid)
        assert orphans.sweep() is False
        assert _state(claimed.pid) is None  # released: no waiter is left, so it is an orphan
        assert _state(others.pid) == "Z"
    finally:
        for process in (*exited, running):
            process.wait()


def test_a_sweep_asked_for_during_a_sweep_leaves_one_chain_that_close_stops(
    tmp_path: Path,
) -> None:
    """The hook run before a sweep may hear of a gone process and ask for a sweep itself:
    that one replaces the chain, which must not go on as well, past ``close``."""
    running = subprocess.Popen([_named(tmp_path, "bs-worker-1"), "3"])
    sweeps: list[float] = []

    def heard() -> None:
        sweeps.append(time.monotonic())
        if len(sweeps) == 1:
            orphans.sweep_soon()

    orphans = Orphans(NAMES, heard)

    async def sweep_then_close() -> int:
        orphans.sweep_soon()
        await asyncio.sleep(0.5)
        orphans.close()
        closed = len(sweeps)
        await asyncio.sleep(0.8)  # past two more pauses of any chain left running
        return len(sweeps) - closed

    try:
        assert asyncio.run(sweep_then_close()) == 0
        assert len(sweeps) >= 3  # the chain went on while the child ran
    finally:
        running.kill()
        running.wait()
