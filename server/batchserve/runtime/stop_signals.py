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

What cannot wait for the event loop runs as the signal is delivered (``install``): the
loop's handler runs only after the requests it read in the same pass are dispatched, so
requests sent just after a SIGINT were accepted and answered (two runs in ten of Triton's
``L0_grpc_state_cleanup`` shutdown case, where Triton refuses them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from functools import partial
from types import FrameType

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
        self.delivered = 0
        """Signals delivered so far: counted as each arrives, ahead of ``count``."""

    def install(
        self,
        loop: asyncio.AbstractEventLoop,
        at_delivery: Callable[[int], None] | None = None,
    ) -> None:
        """Handle the stop signals on ``loop`` (replacing Python's KeyboardInterrupt); call
        ``at_delivery`` with ``delivered`` the moment each signal is delivered.

        The loop runs its handler (``receive``) as a callback, after the I/O of the pass that
        saw the signal: requests read in that pass are dispatched first. Python runs a
        signal's own handler in this thread at the next bytecode, so ``at_delivery`` runs
        before any of them; it may only set plain attributes, since it interrupts whatever
        the thread was doing. The loop's own handler is chained after it, unchanged."""
        for sig in SIGNALS:
            loop.add_signal_handler(sig, partial(self.receive, sig.name))
            if at_delivery is not None:
                signal.signal(sig, partial(self._deliver, at_delivery, signal.getsignal(sig)))

    def _deliver(
        self,
        at_delivery: Callable[[int], None],
        loop_handler: object,
        signum: int,
        frame: FrameType | None,
    ) -> None:
        self.delivered += 1
        at_delivery(self.delivered)
        if callable(loop_handler):  # the one the loop installed; its wakeup fd still wakes it
            loop_handler(signum, frame)

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
