"""Starting the peer server: a start that hangs is killed with its children and tried again."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from bench import servers
from bench.peers import launch

# Hangs on its first start with a child that shares its output pipe, as tritonserver does
# under PyTriton; on the second start it is ready at once.
STAND_IN = """
import os, subprocess, sys, time
marker, children = sys.argv[1], sys.argv[2]
if not os.path.exists(marker):
    open(marker, "w").close()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(children, "w") as out:
        out.write(str(child.pid))
    time.sleep(120)
print("READY", flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (nothing left running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_a_hung_start_is_killed_with_its_children_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "START_TIMEOUT_S", 2.0)
    marker, children = tmp_path / "started", tmp_path / "child.pid"
    command = [sys.executable, "-c", STAND_IN, str(marker), str(children)]
    began = time.monotonic()
    process = launch.start(command, dict(os.environ))
    try:
        assert process.poll() is None  # the second start, ready
        assert 2.0 <= time.monotonic() - began < 60
        child = int(children.read_text())
        deadline = time.monotonic() + 10
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child), "the first start's child outlived it"
    finally:
        servers.stop(process)
        assert process.stdout is not None
        process.stdout.close()


def test_a_start_that_hangs_every_time_fails_after_the_last_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "START_TIMEOUT_S", 1.0)
    command = [sys.executable, "-c", "import time; time.sleep(120)"]
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="PyTriton did not start"):
        launch.start(command, dict(os.environ))
    assert time.monotonic() - began < 30  # two tries of a second, not the watchdog's ten minutes
