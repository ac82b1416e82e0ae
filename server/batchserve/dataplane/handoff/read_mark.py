"""How many of a worker's request frames the model-owning process has read, kept in the
worker's request arena, where the worker looks it up without a frame.

While some of its request frames are unread there, a worker holds its next requests, which
then travel together (``groups.py``). It used to learn of every read by a frame ("k"): half
of the model-owning process's writes to its workers, each waking a worker that was asleep
whether or not it held anything, on hosts where a byte to another thread and back takes
60-230 µs (``bench/NOTES.md``, thirty-third and thirty-fourth rounds). Now the count lives
here, the worker raises a flag when it starts holding requests, and the frame is sent only
while the flag is up: the one wake left is the one that sends held requests on.

Both sides store, then load what the other stores (the worker its flag and then the count,
the model-owning process the count and then the flag). ``_fence`` keeps each store ahead of
the load after it where a CPU would reorder them. Should both loads still miss, the worker
looks again whenever a frame from the model-owning process arrives, and one always does: the
answer to the request frame it took for unread.
"""

from __future__ import annotations

import threading

from batchserve.dataplane.handoff.arena import Arena

READ = 0
"""Word of the request arena's control line: request frames read, by the model-owning
process, which alone writes it."""
HOLDING = 1
"""Word set to 1 by the worker while it holds requests for the count to catch up; cleared by
the model-owning process as it writes "k", or by the worker when the count caught up
meanwhile."""


def _fence() -> None:
    """A full memory barrier: a lock's acquire is an atomic read-modify-write, which
    orders the stores before it ahead of the loads after it on x86."""
    with _LOCK:
        pass


_LOCK = threading.Lock()


class ReadMark:
    """The count and the flag in an arena's control line, seen from either process."""

    __slots__ = ("_words",)

    def __init__(self, requests: Arena) -> None:
        self._words = requests.control

    @property
    def read(self) -> int:
        return int(self._words[READ])

    # the model-owning process ---------------------------------------------------------
    def advance(self, frames: int) -> bool:
        """Count ``frames`` more read; True when the worker holds requests until it learns
        of it (it is then owed a "k" frame, and the flag is down again)."""
        words = self._words
        words[READ] += frames
        _fence()
        if words[HOLDING]:
            words[HOLDING] = 0
            return True
        return False

    # the worker -----------------------------------------------------------------------
    def hold(self, sent: int) -> bool:
        """Whether requests must wait because some of the ``sent`` request frames are
        unread; if so the flag is up, so that the model-owning process says when they
        have all been read."""
        words = self._words
        if words[READ] == sent:
            return False
        words[HOLDING] = 1
        _fence()
        if words[READ] == sent:  # read meanwhile, perhaps without seeing the flag
            words[HOLDING] = 0
            return False
        return True
