"""Whether a server's public listeners still accept requests.

A stop must refuse every request that comes after it, as Triton does, and a request the
event loop reads in the same pass as the stop signal comes after it. The loop itself runs a
signal's handler only once the requests it read alongside are dispatched, and the listeners
close passes later, so the stop closes the intake the moment the signal is delivered
(``runtime/stop_signals.py``), and each protocol reads it where it accepts a request.

The state is one word, read and written in place without a lock: closing it from a signal
handler, between any two bytecodes of the event loop's thread, is safe, and the word may
live in memory another process maps. With ``--workers N`` it does: each worker's intake is a
word of its request arena (``dataplane/handoff/intake_word.py``), which the model-owning
process, the one the stop signal reaches, closes as it closes its own. A worker learned of
the stop from a drain frame its event loop read later, and took requests meanwhile (3 to 5
in 20 runs of Triton's ``L0_grpc_state_cleanup`` shutdown case).
"""

from __future__ import annotations


class Intake:
    """Open until the stop begins; closed once, for good."""

    __slots__ = ("_word", "_words")

    def __init__(self, words: memoryview | None = None, word: int = 0) -> None:
        """``words``: unsigned 64-bit words (``memoryview.cast("Q")``) that hold the state
        at ``word``, zero while open; none, a word of its own."""
        self._words = words if words is not None else memoryview(bytearray(8)).cast("Q")
        self._word = word

    @property
    def open(self) -> bool:
        return not self._words[self._word]

    def close(self) -> None:
        self._words[self._word] = 1
