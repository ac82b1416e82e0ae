"""Decoupled models: any number of replies to one request (Triton's ``decoupled: true``).

A decoupled model is served by a ``Responder`` in place of the batcher: the dataplane hands
it one request's validated inputs and relays each reply as it comes. The last reply carries
the final flag; a request can also end with a final flag and no outputs (Triton sends that
as an empty response only to clients that ask for one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from batchserve.scheduler.work import Arrays


@dataclass(frozen=True, slots=True)
class Reply:
    """One response of a decoupled model: its outputs (none for a bare final flag)."""

    outputs: Arrays = field(default_factory=dict)
    final: bool = False


class Responder(Protocol):
    """How a decoupled model answers: ``replies`` ends after the reply marked final.

    ``replies`` checks the request before it yields anything: a bad request raises from
    the first ``__anext__``. ``cancelled`` returns True once the client has gone; closing
    the iterator (the client left) also stops the work for that request. ``streaming`` says
    whether the client reads replies as they come (a gRPC stream, ``generate_stream``) or
    waits for one (``generate``): a model that can answer either way follows it where the
    request does not say.
    """

    def replies(
        self, inputs: Arrays, cancelled: Callable[[], bool] | None, streaming: bool
    ) -> AsyncGenerator[Reply, None]: ...

    @property
    def active(self) -> int:
        """Requests being answered now."""
        ...

    async def close(self) -> None:
        """Stop taking requests; those being answered finish first."""
        ...


class CountedRequests:
    """Counts requests being answered, and lets ``close`` wait for them: the ``active`` and
    ``close`` of a ``Responder``; ``_began`` and ``_ended`` around each request."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    def _began(self) -> None:
        self._active += 1
        self._idle.clear()

    def _ended(self) -> None:
        self._active -= 1
        if not self._active:
            self._idle.set()

    async def close(self) -> None:
        await self._idle.wait()
