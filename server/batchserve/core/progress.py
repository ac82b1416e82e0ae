"""What a long command is doing, told to the person at the terminal and to no one else.

``batchserve export`` and ``batchserve repo validate`` can take seconds to minutes; a line as
each stage starts and ends (with its time) and a closing summary show that work goes on and
where the time went. The lines go to stderr, so stdout stays what scripts read, and only when
stderr is a terminal and ``--quiet`` was not given: a pipe or a CI log gets nothing extra.
Plain lines, not a live display: they read the same in a terminal's scrollback and never
fight with what the command prints on stdout meanwhile.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class StageProgress:
    """Stage lines and a summary for one run of a command, or nothing when not ``visible``.

    Args:
        command: prefix of every line (``batchserve export``), as the command's errors have.
        stream: where the lines go; None keeps the timings and writes nothing.
    """

    def __init__(self, command: str, stream: TextIO | None = None) -> None:
        self._command = command
        self._stream = stream
        self._started = time.monotonic()
        self.timings: dict[str, float] = {}
        """Seconds each finished stage took, in the order they ran."""

    @classmethod
    def for_stderr(cls, command: str, *, quiet: bool = False) -> StageProgress:
        """Visible on stderr when it is a terminal and the user did not ask for quiet."""
        stream = sys.stderr
        return cls(command, None if quiet or not _is_terminal(stream) else stream)

    @property
    def visible(self) -> bool:
        return self._stream is not None

    @property
    def elapsed(self) -> float:
        """Seconds since the command started."""
        return time.monotonic() - self._started

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        """One line when the stage starts (``detail`` says on what), one when it ends or fails."""
        self.say(f"{name}: {detail} ..." if detail else f"{name} ...")
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.say(f"{name}: failed after {_seconds(time.monotonic() - started)}")
            raise
        took = time.monotonic() - started
        self.timings[name] = took
        self.say(f"{name}: done in {_seconds(took)}")

    def say(self, text: str) -> None:
        """One progress line (an item within a stage, say)."""
        if self._stream is not None:
            print(f"{self._command}: {text}", file=self._stream, flush=True)

    def finish(self, summary: str) -> None:
        """The closing line: what was achieved, the total time, and the time of each stage."""
        stages = ", ".join(f"{name} {_seconds(took)}" for name, took in self.timings.items())
        where = f"; {stages}" if stages else ""
        self.say(f"{summary} in {_seconds(self.elapsed)}{where}")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"
