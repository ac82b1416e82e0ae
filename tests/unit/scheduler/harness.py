"""Building batchers and requests for the scheduler tests, and holding an instance busy."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from batchserve.backends.base import Backend
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import Arrays, WorkItem
from fakes import FakeBackend, ManualClock, fake_config


def batcher_for(
    backends: list[Backend], config: ModelConfig, clock: ManualClock | None = None
) -> Batcher:
    pool = InstancePool([Instance(f"fake-{i}", b) for i, b in enumerate(backends)])
    policy = BatchPolicy.from_config(config, server_max_queue_size=64)
    if clock is None:
        return Batcher(pool, policy, ModelStats())
    return Batcher(pool, policy, ModelStats(), clock=clock, timer=clock)


ONE_SECOND_NS = 1_000_000_000
"""An inline threshold under which any run of the fake model counts as fast."""


def inline_batcher(backends: list[FakeBackend], *, inline: bool) -> Batcher:
    """A batcher over the fake model that runs batches measured fast on the event loop
    (``inline``)."""
    pool = InstancePool([Instance(f"fake-{i}", b) for i, b in enumerate(backends)])
    policy = BatchPolicy.from_config(fake_config(""), server_max_queue_size=64)
    inline_below_ns = ONE_SECOND_NS if inline else 0
    return Batcher(pool, policy, ModelStats(), inline_below_ns=inline_below_ns)


def make_batcher(
    backends: list[FakeBackend],
    extra: str = "",
    *,
    batching: bool = True,
    clock: ManualClock | None = None,
    **fields: int,
) -> Batcher:
    """A batcher over the fake model, its config changed by ``extra`` pbtxt and ``fields``."""
    return batcher_for(list(backends), fake_config(extra, batching=batching, **fields), clock)


def request(
    inputs: Arrays,
    *,
    priority: int = 1,
    deadline_ns: int | None = None,
    at: ManualClock | None = None,
    outputs: tuple[str, ...] = ("y", "total"),
) -> WorkItem:
    """A request arriving now (on ``at`` when given, else the real monotonic clock)."""
    future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
    rows = len(next(iter(inputs.values())))
    now = at() if at is not None else time.monotonic_ns()
    return WorkItem(inputs, rows, outputs, priority, now, deadline_ns, future)


def item(
    rows: int,
    value: float,
    priority: int = 1,
    deadline_ns: int | None = None,
    at: ManualClock | None = None,
) -> WorkItem:
    """A request to the fake model: ``rows`` samples of four copies of ``value``."""
    x = np.full((rows, 4), value, dtype=np.float32)
    return request({"x": x}, priority=priority, deadline_ns=deadline_ns, at=at)


WAIT_S = 10
"""Longest a test waits for an answer: a scheduler bug fails the test rather than hang it."""


async def answers(*items: WorkItem) -> list[Arrays]:
    """Each request's outputs, in order; raises the first request's error, if any."""
    return list(await asyncio.wait_for(asyncio.gather(*(i.future for i in items)), WAIT_S))


async def answer(one: WorkItem) -> Arrays:
    return (await answers(one))[0]


async def outcomes(*items: WorkItem) -> list[Arrays | BaseException]:
    """Each request's outputs or error, in order."""
    futures = asyncio.gather(*(i.future for i in items), return_exceptions=True)
    return list(await asyncio.wait_for(futures, WAIT_S))


async def submit(batcher: Batcher, *items: WorkItem) -> None:
    """Submit each request in an event-loop pass of its own, as requests that arrive apart
    do; return once the batcher has dispatched after the last (it does once per pass)."""
    for one in items:
        batcher.submit(one)
        await asyncio.sleep(0)


async def entered(backend: FakeBackend) -> None:
    """Until the backend has started one more batch."""
    assert await asyncio.to_thread(backend.entered.acquire, True, 5)


async def hold_first(
    batcher: Batcher, backend: FakeBackend, at: ManualClock | None = None
) -> WorkItem:
    """Occupy the instance so that later requests queue up behind a closed gate."""
    backend.gate.clear()
    first = item(1, 0.0, at=at)
    batcher.submit(first)
    await entered(backend)
    return first


def expected(x: np.ndarray) -> dict[str, np.ndarray]:
    """What the fake model answers for ``x``."""
    return {"y": x * 2 + 1, "total": x.sum(axis=1, keepdims=True)}
