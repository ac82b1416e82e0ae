"""Stopping an ONNX Runtime run from another thread.

ORT checks a run's ``RunOptions.terminate`` flag between two nodes and ends the run with an
error when it is set. The options a run uses are chosen per batch (plain, a CUDA graph's, one
that shrinks the arena after a loan) and shared between runs, so the flag is set only on the
options of the run in progress, and cleared when that run ends: a stop that comes as the run
finishes must not end the next one, which answers other clients.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class RunStopper:
    """The run options of the run in progress on one session, for ``stop``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Any = None
        self._stopped = False

    @contextmanager
    def running(self, options: Any) -> Iterator[None]:
        """Around one run with ``options``: ``stop`` meanwhile ends it."""
        with self._lock:
            self._running = options
        try:
            yield
        finally:
            with self._lock:
                self._running = None
                if self._stopped:
                    options.terminate = False
                    self._stopped = False

    def stop(self) -> None:
        """End the run in progress, if any (ORT raises in its thread); nothing otherwise."""
        with self._lock:
            if self._running is not None:
                self._running.terminate = True
                self._stopped = True
