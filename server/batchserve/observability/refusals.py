"""Server-wide counts of connections and requests turned away before any model ran them.

Refusals happen where nothing holds a reference to the server: inside uvicorn's protocol
objects, in grpc.aio's call handling, in the error mappers. So the counts live in one
process-wide object, as prometheus_client keeps its default registry, and the metrics
collector reads them at scrape time. Per-model rejections (queue full, timed out in the
queue) stay in each model's statistics; this counts what the server refused as a whole.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

from batchserve.core.errors import (
    BatchserveError,
    ControlDisabled,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from batchserve.core.request_memory import RequestMemoryFull


class Protocol(StrEnum):
    """The listener that refused."""

    HTTP = "http"
    GRPC = "grpc"
    METRICS = "metrics"


class Reason(StrEnum):
    """Why work was refused; each is a limit, a timeout or a state, never a model's error."""

    HEAD_TOO_LARGE = "head_too_large"
    BODY_TOO_LARGE = "body_too_large"
    MALFORMED = "malformed"
    OVERLOADED = "overloaded"
    REQUEST_MEMORY = "request_memory"
    UNAVAILABLE = "unavailable"
    CONTROL_DISABLED = "control_disabled"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"
    SEND_TIMEOUT = "send_timeout"
    TOO_MANY_CALLS = "too_many_calls"
    HANDSHAKE_TIMEOUT = "handshake_timeout"


_ERROR_REASONS: tuple[tuple[type[BatchserveError], Reason], ...] = (
    # Most specific first: RequestMemoryFull is Overloaded, and Overloaded and
    # ControlDisabled are Unavailable too.
    (PayloadTooLarge, Reason.BODY_TOO_LARGE),
    (RequestMemoryFull, Reason.REQUEST_MEMORY),
    (Overloaded, Reason.OVERLOADED),
    (ControlDisabled, Reason.CONTROL_DISABLED),
    (Unavailable, Reason.UNAVAILABLE),
    (Unauthenticated, Reason.UNAUTHENTICATED),
    (PermissionDenied, Reason.PERMISSION_DENIED),
)


class Refusals:
    """Counts by (protocol, reason); increments are plain dict updates on the event loop."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[Protocol, Reason]] = Counter()

    def count(self, protocol: Protocol, reason: Reason) -> None:
        self._counts[(protocol, reason)] += 1

    def count_error(self, protocol: Protocol, error: BaseException) -> None:
        """Count ``error`` when it is a refusal; a client's mistake or a model's failure
        is not one (those are the per-model failure counters)."""
        for kind, reason in _ERROR_REASONS:
            if isinstance(error, kind):
                self.count(protocol, reason)
                return

    def snapshot(self) -> dict[tuple[Protocol, Reason], int]:
        return dict(self._counts)


REFUSALS = Refusals()
"""The process's counts; the server's collector exposes them as batchserve_refusals_total."""
