"""Retries of calls the server could not take: exponential backoff with full jitter.

``Unavailable`` (HTTP 503 or 429, gRPC UNAVAILABLE, no connection) is retried for every
call but health checks (whose answer is the state): the server did not do the work.
``ConnectionLost`` is retried only for calls that are safe to repeat (metadata,
configuration, statistics), never for inference or model control; nothing else is.
Attempts are bounded in number and by the call's timeout, which covers every attempt
and every wait; a wait that would pass it is not started.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from batchserve_client.errors import (
    BatchserveClientError,
    ConnectionLost,
    DeadlineExceeded,
    Unavailable,
)

T = TypeVar("T")


class Retry(enum.Enum):
    """Which failures a kind of call may be retried after."""

    NEVER = "never"  # health probes: the caller polls
    UNAVAILABLE = "unavailable"  # inference, model control: may have effects
    IDEMPOTENT = "idempotent"  # reads: also when the connection broke mid-call


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One failed attempt that will be retried.

    Args:
        attempt: the number of the attempt that failed, from 1.
        delay: seconds the client waits before the next attempt.
        error: why the attempt failed.
    """

    attempt: int
    delay: float
    error: BatchserveClientError


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a client retries.

    The n-th wait is drawn uniformly from [0, min(max_backoff, initial_backoff *
    multiplier**(n-1))] ("full jitter", so that many clients do not retry in step), and
    is at least the server's ``Retry-After``, itself capped at ``max_backoff``.

    Args:
        max_attempts: attempts in all, the first one included; 1 never retries.
        initial_backoff: the cap of the first wait, in seconds.
        multiplier: the factor the cap grows by after each attempt.
        max_backoff: the longest any wait may be, in seconds.
        on_retry: called before each wait (to count or log retries).
    """

    max_attempts: int = 4
    initial_backoff: float = 0.1
    multiplier: float = 2.0
    max_backoff: float = 5.0
    on_retry: Callable[[RetryEvent], None] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and the multiplier >= 1")

    def delay(
        self, attempt: int, retry_after: float | None, uniform: Callable[[float, float], float]
    ) -> float:
        """The wait after failed attempt number ``attempt`` (from 1)."""
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return min(max(uniform(0.0, cap), retry_after or 0.0), self.max_backoff)


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


def retryable(error: BatchserveClientError, kind: Retry) -> bool:
    if kind is Retry.NEVER:
        return False
    if isinstance(error, Unavailable):
        return True
    return kind is Retry.IDEMPOTENT and isinstance(error, ConnectionLost)


class Attempts:
    """The schedule of one call: the time each attempt has, and the wait after a failure."""

    def __init__(
        self,
        policy: RetryPolicy,
        kind: Retry,
        timeout: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self._policy, self._kind, self._timeout = policy, kind, timeout
        self._clock, self._uniform = clock, uniform
        self._deadline = None if timeout is None else clock() + timeout
        self._failed = 0

    def remaining(self) -> float | None:
        """Seconds the next attempt may take (None: no limit)."""
        if self._deadline is None:
            return None
        left = self._deadline - self._clock()
        if left <= 0:
            raise DeadlineExceeded(f"the call's timeout of {self._timeout} s has passed")
        return left

    def after_failure(self, error: BatchserveClientError) -> float | None:
        """Seconds to wait before the next attempt, or None to give up with this error."""
        self._failed += 1
        if not retryable(error, self._kind) or self._failed >= self._policy.max_attempts:
            return None
        delay = self._policy.delay(self._failed, error.retry_after, self._uniform)
        if self._deadline is not None and self._clock() + delay >= self._deadline:
            return None
        if self._policy.on_retry is not None:
            self._policy.on_retry(RetryEvent(self._failed, delay, error))
        return delay


def run(attempt: Callable[[float | None], T], attempts: Attempts) -> T:
    """Call ``attempt(seconds_left)`` until it succeeds or the schedule gives up."""
    while True:
        try:
            return attempt(attempts.remaining())
        except BatchserveClientError as error:
            delay = attempts.after_failure(error)
            if delay is None:
                raise
        time.sleep(delay)


async def run_async(attempt: Callable[[float | None], Awaitable[T]], attempts: Attempts) -> T:
    """``run`` for coroutines: the waits do not block the event loop."""
    while True:
        try:
            return await attempt(attempts.remaining())
        except BatchserveClientError as error:
            delay = attempts.after_failure(error)
            if delay is None:
                raise
        await asyncio.sleep(delay)
