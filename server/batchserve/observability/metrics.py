"""What the hot path records for Prometheus, and the `/metrics` endpoint that serves it.

Counters and gauges already kept by ``ModelStats``, the batcher and the memory budgets are
read at scrape time (``metrics_collector``). Only the distributions need work per request
or batch: ``Observations`` holds their bucket counts, one object per served version, so
recording is a bisect and two additions with no labels to look up and no lock (the event
loop is the only writer, and the scrape runs on the same loop).
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Awaitable, Callable, MutableMapping
from enum import StrEnum
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry

from batchserve.core.errors import Cancelled, DeadlineExceeded, InvalidArgument, Overloaded
from batchserve.observability.exposition import FamilySource, metrics_body

NS = 1_000_000_000
LATENCY_BUCKETS_NS: tuple[int, ...] = (
    *(int(m * 10**e) for e in range(5, 10) for m in (1, 2.5, 5)),
    10 * NS,
)
"""100 µs … 10 s, three buckets a decade (1, 2.5, 5)."""
BATCH_SIZE_BUCKETS: tuple[int, ...] = tuple(2**i for i in range(11))
"""1 … 1024 samples, powers of two."""
OCCUPANCY_BUCKETS: tuple[float, ...] = tuple(i / 10 for i in range(1, 11))
"""Batch size over the batch cap: 0.1 … 1."""


class Buckets:
    """Histogram bucket counts (non-cumulative; the last one is +Inf) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total: float = 0

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.total += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self, scale: float = 1) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus exposes them, bounds divided by ``scale``."""
        les = [repr(bound / scale) for bound in self.bounds] + ["+Inf"]
        return list(zip(les, accumulate(self.counts), strict=True))


class Observations:
    """The distributions of one served version.

    Latencies are kept in nanoseconds (integers: no division per request) and exposed in
    seconds. ``request`` and ``queue`` count successful requests (a rejection is counted by
    reason instead); ``compute``, ``batch_size`` and ``occupancy`` count model executions.
    """

    __slots__ = ("batch_size", "compute", "occupancy", "queue", "request")

    def __init__(self) -> None:
        self.request = Buckets(LATENCY_BUCKETS_NS)
        self.queue = Buckets(LATENCY_BUCKETS_NS)
        self.compute = Buckets(LATENCY_BUCKETS_NS)
        self.batch_size = Buckets(BATCH_SIZE_BUCKETS)
        self.occupancy = Buckets(OCCUPANCY_BUCKETS)

    def on_request(self, total_ns: int, queue_ns: int, count: int = 1) -> None:
        self.request.observe(total_ns, count)
        self.queue.observe(queue_ns, count)

    def on_batch(self, size: int, compute_ns: int, cap: int) -> None:
        self.compute.observe(compute_ns)
        self.batch_size.observe(size)
        if cap:
            self.occupancy.observe(size / cap)


class Rejection(StrEnum):
    """Why a request was turned away before (or instead of) an answer."""

    QUEUE_FULL = "queue_full"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INVALID = "invalid"


def rejection_of(error: BaseException) -> Rejection | None:
    """The rejection an error stands for; None for a failure of the server or model."""
    if isinstance(error, Overloaded):
        return Rejection.QUEUE_FULL
    if isinstance(error, DeadlineExceeded):
        return Rejection.TIMEOUT
    if isinstance(error, asyncio.CancelledError | Cancelled):
        return Rejection.CANCELLED
    if isinstance(error, InvalidArgument):
        return Rejection.INVALID
    return None


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def metrics_app(
    registry: CollectorRegistry,
    before: Callable[[], Awaitable[None]] | None = None,
    triton: FamilySource | None = None,
) -> ASGIApp:
    """``GET /metrics`` in Prometheus text, or OpenMetrics when the Accept header asks for it
    (as Prometheus does); 404 on any other path. ``before``: awaited before each scrape is
    written (the request-handling workers' counts fetched); ``triton``: Triton's own
    families, written after the registry's (``exposition``)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            plain = [(b"content-type", b"text/plain; charset=utf-8")]
            await send({"type": "http.response.start", "status": 404, "headers": plain})
            await send({"type": "http.response.body", "body": b"metrics are served at /metrics\n"})
            return
        if before is not None:
            await before()
        asked = _headers(scope)
        names = parse_qs(scope.get("query_string", b"").decode()).get("name[]")
        body, headers = metrics_body(
            registry, triton, asked.get("accept", ""), asked.get("accept-encoding", ""), names
        )
        if (await receive()).get("type") != "http.request":
            return  # the client left before its request was read
        raw = [(name.lower().encode(), value.encode()) for name, value in headers]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    return app


def _headers(scope: Scope) -> dict[str, str]:
    """Request headers by lower-case name; a repeated header's values joined by commas."""
    joined: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        joined[key] = f"{joined[key]},{text}" if key in joined else text
    return joined
