"""How fast this host runs Python and wakes a sleeping thread, for a results file's head.

Request handling spends its time on both, and the reference machine's host changes under
the same name from one day to the next: a 10-million-step Python loop took 0.99-1.41 s on
some days and 0.24-0.37 s on another, on which a byte sent to another thread and back cost
57-227 µs and a request cost the server four times the CPU it had cost before
(``bench/NOTES.md``, thirty-third round). Each results file records both figures, taken at
its start, so that figures from different days can be read side by side.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from dataclasses import dataclass

from batchserve.core.python_speed import loop_seconds

LOOP_STEPS = 10_000_000
"""The loop ``bench/NOTES.md`` has always timed: 0.2-1.4 s on the reference VM."""
ROUND_TRIPS = 400
"""Wakes timed in a batch: 0.1 s where one costs 200 µs, as on that host when idle."""
BATCHES = 5
"""Batches of ``ROUND_TRIPS``, of which the median is given: the same host's figure moved by
a factor of two from one batch to the next."""


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """Seconds a 10-million-step Python loop takes; microseconds one thread takes to wake
    another through a socket pair and be woken by its answer."""

    loop_s: float
    wake_us: float

    def __str__(self) -> str:
        return (
            f"Host speed: a 10-million-step Python loop in {self.loop_s:.2f} s; a byte to "
            f"another thread and back through a socket pair in {self.wake_us:.1f} µs"
        )


def measure() -> HostSpeed:
    return HostSpeed(_loop_s(), _wake_us())


def _loop_s() -> float:
    return loop_seconds(LOOP_STEPS)


def _wake_us() -> float:
    return statistics.median(_wake_batch_us() for _ in range(BATCHES))


def _wake_batch_us() -> float:
    """The mean round trip of one byte between this thread and an echoing one; each side
    sleeps in ``recv`` until the other writes, as a server's loop sleeps until a request."""
    here, there = socket.socketpair()
    echo = threading.Thread(target=_echo, args=(there, ROUND_TRIPS), daemon=True)
    with here, there:
        echo.start()
        started = time.perf_counter()
        for _ in range(ROUND_TRIPS):
            here.sendall(b"x")
            here.recv(1)
        elapsed = time.perf_counter() - started
        echo.join()
    return elapsed / ROUND_TRIPS * 1e6


def _echo(end: socket.socket, times: int) -> None:
    for _ in range(times):
        end.sendall(end.recv(1))
