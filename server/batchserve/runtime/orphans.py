"""The zombies the model-owning process adopts and nothing waits for: reaped.

The model-owning process is the child subreaper (``fork_server``), so a process the fork
server forked becomes its child whenever that process's parent dies first: a middle process
whose fork server died while it forked, or a worker its middle process killed when the
worker's pidfd could not be taken. Nothing waits for these, and each would stay a zombie,
holding its pid and its slot in the process table, until the server exits.

A blanket ``waitpid(-1)`` would reap them, and also steal the exit statuses that others wait
for: the fork server's, each forked worker's (through its pidfd) and each fresh
interpreter's (the event loop's child watcher, which then never learns of the exit). Those
are claimed. A sweep reaps the unclaimed zombies among this process's children that carry a
batchserve process name (a fresh interpreter takes its name only once claimed), and sweeps
again, pausing longer each time, while such children still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

SWEEP_FIRST_S = 0.05
SWEEP_MAX_S = 5.0
"""The pause between sweeps doubles from the first to this while orphans still run."""


class Orphans:
    """This process's children that nothing waits for, reaped on request."""

    def __init__(self, names: tuple[str, ...], before_sweep: Callable[[], None]) -> None:
        self._names = names
        self._before_sweep = before_sweep
        self._claimed: set[int] = set()
        self._pause = SWEEP_FIRST_S
        self._timer: asyncio.TimerHandle | None = None

    def claim(self, pid: int) -> None:
        """Leave this child to whatever waits for it."""
        self._claimed.add(pid)

    def release(self, pid: int) -> None:
        """Its waiter has reaped it."""
        self._claimed.discard(pid)

    def sweep_soon(self) -> None:
        """Sweep shortly, and again while orphans still run: one may have just been made."""
        if self._timer is not None:
            self._timer.cancel()
        self._pause = SWEEP_FIRST_S
        self._timer = asyncio.get_running_loop().call_later(self._pause, self._sweep_on)

    def close(self) -> None:
        """Stop sweeping: the server exits, and its zombies with it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sweep(self) -> bool:
        """Reap the unclaimed zombies; whether unclaimed children of ours still run."""
        self._before_sweep()  # a worker's pid on its way here is claimed before it is judged
        running = False
        for pid, name, zombie in _children():
            if pid in self._claimed or not name.startswith(self._names):
                continue
            if not zombie:
                running = True
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
                logger.info(
                    "an orphaned process was reaped", extra={"pid": pid, "process_name": name}
                )
        return running

    def _sweep_on(self) -> None:
        self._timer = None
        running = self.sweep()
        if running and self._timer is None:  # a sweep_soon during the sweep has its own timer
            self._pause = min(2 * self._pause, SWEEP_MAX_S)
            self._timer = asyncio.get_running_loop().call_later(self._pause, self._sweep_on)


def _children() -> Iterator[tuple[int, str, bool]]:
    """This process's children: pid, name, and whether each is a zombie. Read from every
    process's ``/proc/PID/stat`` (``/proc/PID/task/TID/children`` is missing from kernels
    built without ``CONFIG_PROC_CHILDREN``); sweeps are rare."""
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                line = stat.read().decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        name, _, rest = line.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        if len(fields) >= 2 and fields[1] == str(me):
            yield int(entry.name), name, fields[0] == "Z"
