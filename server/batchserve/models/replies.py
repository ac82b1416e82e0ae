"""A decoupled request's replies, counted into its model's statistics as they go: a
client's request (``dataplane/plane.py``) or an ensemble's step (``ensemble_flow.py``).

Triton counts the N-th response of every request (``response_stats``): the time to compute
it, since the request's compute began or the previous response was written, and the time
to write it; an empty response (no outputs, a final flag) its compute time only; a request
cancelled or failed at its N-th response, the time until then. The request itself counts
as one execution of one request, its replies the compute, as Triton's repeat backend
reports a decoupled request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator

from batchserve.models.admission import record_failure
from batchserve.models.model_table import ServedVersion
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.responders import Reply


class ReplyCounts:
    """The replies of one request so far; ``first_ns`` when its first one was written."""

    __slots__ = ("_last", "_stats", "first_ns", "index")

    def __init__(self, stats: ModelStats, began_ns: int) -> None:
        self._stats = stats
        self._last = began_ns
        self.index = 0
        self.first_ns: int | None = None

    def empty(self) -> None:
        """A reply without outputs (a final flag), whether or not the client asked for it."""
        now = time.monotonic_ns()
        self._stats.record_response(self.index, "empty", now - self._last)
        self._next(now)

    def written(self, ready_ns: int) -> None:
        """A reply computed at ``ready_ns`` whose response is now written."""
        now = time.monotonic_ns()
        self._stats.record_response(self.index, "success", ready_ns - self._last, now - ready_ns)
        if self.first_ns is None:
            self.first_ns = now
        self._next(now)

    def ended(self, error: BaseException) -> None:
        """The request stopped at its next reply: cancelled (or its stream closed under
        it), or failed."""
        gone = isinstance(error, (asyncio.CancelledError, GeneratorExit))
        outcome = "cancel" if gone else "fail"
        self._stats.record_response(self.index, outcome, time.monotonic_ns() - self._last)

    def _next(self, now: int) -> None:
        self.index += 1
        self._last = now


async def counted(
    served: ServedVersion,
    replies: AsyncGenerator[Reply, None],
    started: int,
    protocol: str,
    request_id: str,
    empty_final: bool,
) -> AsyncGenerator[Reply, None]:
    """``replies`` of one request begun at ``started``, counted into ``served``'s
    statistics; a bare final flag is passed on only when ``empty_final`` (it counts either
    way). Each reply is counted written when it is handed on: the caller writes it before
    asking for the next."""
    began = time.monotonic_ns()
    counts = ReplyCounts(served.stats, began)
    try:
        async with contextlib.aclosing(replies):
            async for reply in replies:
                ready = time.monotonic_ns()
                if not reply.outputs:
                    counts.empty()
                    if empty_final:
                        yield reply
                    continue
                counts.written(ready)
                yield reply
    except BaseException as exc:
        counts.ended(exc)  # the reply it stopped at is counted
        record_failure(served, started, exc, protocol, request_id)
        raise
    finished = time.monotonic_ns()
    # without these the model's counts and compute would stay 0
    served.stats.record_batch(1, 0, finished - began, 0)
    served.stats.record_compute(1, 0, finished - began, 0, responses=False)
    served.stats.record_request(
        True, finished - started, 0, protocol=protocol,
        first_response_ns=(counts.first_ns or finished) - started,
    )  # fmt: skip
