"""Keeping load-time measurements apart from anything else that allocates at load.

A memory probe reads process- or device-wide figures (RSS, NVML), and so does the timing of
measured defaults: two at once would each count the other, and so would an instance loading
beside them. Loads that only allocate (an instance that takes its twin's measured profile)
may run beside each other, but never beside a measurement. Measurements go first when both
wait, so that a long run of loads cannot hold one off.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class MeasuringGate:
    """One measurement at a time, alone; allocating loads together, between measurements."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._measuring = False
        self._waiting = 0  # measurements waiting for the loads to finish
        self._loading = 0

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Held while a figure is read that anything else allocating would disturb."""
        with self._changed:
            self._waiting += 1
            try:
                self._changed.wait_for(lambda: not self._measuring and not self._loading)
            finally:
                self._waiting -= 1
            self._measuring = True
        try:
            yield
        finally:
            with self._changed:
                self._measuring = False
                self._changed.notify_all()

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Held while an instance allocates without measuring, beside others that do too."""
        with self._changed:
            self._changed.wait_for(lambda: not self._measuring and not self._waiting)
            self._loading += 1
        try:
            yield
        finally:
            with self._changed:
                self._loading -= 1
                self._changed.notify_all()


MEASURING = MeasuringGate()
"""The process's gate: its memory and its devices are what every measurement reads."""
