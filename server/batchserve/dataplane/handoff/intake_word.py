"""A worker's intake (``core/intake.py``), kept in its request arena's control line.

The stop signal reaches the model-owning process only; it closes every worker's intake the
moment the signal is delivered, by a store into memory both processes map, so no worker
accepts a request that arrives after the stop began, whether or not its event loop has yet
read the drain frame that follows.
"""

from __future__ import annotations

from batchserve.core.intake import Intake
from batchserve.dataplane.handoff.arena import Arena

CLOSED = 2
"""Word of the request arena's control line: non-zero once the server's stop has begun.
Written by the model-owning process alone (words 0 and 1: ``read_mark.py``)."""


def worker_intake(requests: Arena) -> Intake:
    """The intake of the worker whose request arena this is."""
    return Intake(requests.control, CLOSED)
