"""How fast this host runs Python right now, as the time of a bare loop.

Request handling is Python, and the same host runs it at very different speeds from one day
to the next (a 10-million-step loop took 0.24-1.41 s on the reference VM, ``bench/NOTES.md``),
so a rule that weighs a cost against request handling weighs it against this loop, timed on
the spot, rather than against a constant; benchmarks print the same figure in their heads.
"""

from __future__ import annotations

import time


def loop_seconds(steps: int) -> float:
    """Seconds this thread takes for ``steps`` turns of an empty ``for`` loop."""
    started = time.perf_counter()
    for _ in range(steps):
        pass
    return time.perf_counter() - started
