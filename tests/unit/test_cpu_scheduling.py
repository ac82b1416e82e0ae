"""The scheduling policy the server puts its threads under: every thread of the process,
those started later, and nothing when asked for the normal policy. Each case runs in a
fresh interpreter, so that the test process keeps its own policy."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from batchserve.runtime import cpu_scheduling

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")

PROBE = """
import json, os, sys, threading
from batchserve.runtime import cpu_scheduling

release = threading.Event()
before = threading.Thread(target=release.wait, daemon=True)
before.start()
cpu_scheduling.apply(sys.argv[1])
later = []
after = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
after.start()
after.join()
existing = (threading.get_native_id(), before.native_id)
print(json.dumps({
    "existing": [os.sched_getscheduler(t) for t in existing],
    "started_after": later[0],
}))
release.set()
"""


def _probe(policy: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, policy], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_batch_puts_every_thread_and_every_later_one_under_sched_batch() -> None:
    found = _probe("batch")
    assert found["existing"] == [os.SCHED_BATCH, os.SCHED_BATCH]
    assert found["started_after"] == os.SCHED_BATCH


def test_normal_leaves_the_threads_as_they_were() -> None:
    inherited = os.sched_getscheduler(0)  # the probe starts under this process's policy
    found = _probe("normal")
    assert found["existing"] == [inherited, inherited]
    assert found["started_after"] == inherited


def test_a_refused_change_is_logged_and_the_server_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What a seccomp profile that forbids sched_setscheduler does: EPERM."""

    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    before = os.sched_getscheduler(0)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.WARNING):
        cpu_scheduling.apply("batch")
    assert "keep their policy" in caplog.text
    assert os.sched_getscheduler(0) == before
