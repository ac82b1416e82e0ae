"""SIGTERM, SIGINT and SIGHUP as an operator means them: the first stops the server, any
later one hurries the stop; none ever drops a request the server accepted.

The first signal starts the graceful stop (not ready, the shutdown delay, drain, unload).
A second one used to cancel the main task: uvicorn then answered its in-flight requests with
plain-text 500s and the process exited 1 with a traceback. Now every later signal only skips
what is left of the shutdown delay, the one wait that serves no client. What else could be
cut is not: the HTTP and gRPC grace periods and the model queues hold requests already
accepted, and refusing those (even with a retryable 503) would break the rule that no
accepted request is lost. A process that must die at once is sent SIGKILL.

SIGHUP (the terminal or session that started the server closed, or an operator used to
servers that reload on it) killed the server at once, its default: no drain, no log line,
and with ``--workers N`` every worker too, since a hangup reaches the whole process group.
Reloading on it is not offered: the model repository has its own load and unload calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from functools import partial

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The stop signals: the model-owning process's to act on, which its helpers ignore."""


class StopSignals:
    """How many stop signals came, as two events the server's lifecycle waits on."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        """Set by the first signal: stop loading models, drain, exit."""
        self.hurried = asyncio.Event()
        """Set by any later signal: skip the waits that hold no accepted request."""
        self.count = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle the stop signals on ``loop`` (replacing Python's KeyboardInterrupt)."""
        for sig in SIGNALS:
            loop.add_signal_handler(sig, partial(self.receive, sig.name))

    def receive(self, name: str) -> None:
        """One signal: the first stops, every later one hurries (idempotent, never raises)."""
        self.count += 1
        if self.count == 1:
            logger.info("stop requested", extra={"signal": name})
            self.stopping.set()
            return
        logger.warning(
            "drain hurried: shutdown delay skipped, accepted requests are still answered",
            extra={"signal": name, "signals": self.count},
        )
        self.hurried.set()

    async def delay(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if hurried meanwhile; log what was skipped."""
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.hurried.wait(), seconds)
        left = seconds - (time.monotonic() - started)
        if self.hurried.is_set() and left > 0:
            logger.info("shutdown delay cut short", extra={"skipped_seconds": round(left, 2)})
