"""Whether a server's public listeners still accept requests.

A stop must refuse every request that comes after it, as Triton does, and a request the
event loop reads in the same pass as the stop signal comes after it. The loop itself runs a
signal's handler only once the requests it read alongside are dispatched, and the listeners
close passes later, so the stop closes the intake the moment the signal is delivered
(``runtime/stop_signals.py``), and each protocol reads it where it accepts a request: a
plain attribute, so that the read costs one lookup and no lock, and closing it from a signal
handler, between any two bytecodes of the event loop's thread, is safe.
"""

from __future__ import annotations


class Intake:
    """Open until the stop begins; closed once, for good."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True

    def close(self) -> None:
        self.open = False
