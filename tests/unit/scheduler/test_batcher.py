"""The dynamic batcher, driven with a fake backend whose runs the test holds and releases."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from batchserve.errors import BackendError, DeadlineExceeded, Overloaded, Unavailable
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import Arrays, WorkItem
from batchserve.stats import ModelStats
from fakes import FakeBackend, fake_config

pytestmark = pytest.mark.anyio


def _batcher(
    backends: list[FakeBackend], extra: str = "", *, batching: bool = True, **fields: int
) -> Batcher:
    config = fake_config(extra, batching=batching, **fields)
    pool = InstancePool([Instance(f"fake-{i}", b) for i, b in enumerate(backends)])
    return Batcher(pool, BatchPolicy.from_config(config, server_max_queue_size=16), ModelStats())


def _item(rows: int, value: float, priority: int = 1, deadline_ns: int | None = None) -> WorkItem:
    x = np.full((rows, 4), value, dtype=np.float32)
    future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
    return WorkItem(
        {"x": x}, rows, ("y", "total"), priority, time.monotonic_ns(), deadline_ns, future
    )


async def _entered(backend: FakeBackend) -> None:
    await asyncio.to_thread(backend.entered.acquire, True, 5)


async def _hold_first(batcher: Batcher, backend: FakeBackend) -> WorkItem:
    """Occupy the instance so that later requests queue up behind a closed gate."""
    backend.gate.clear()
    first = _item(1, 0.0)
    batcher.submit(first)
    await _entered(backend)
    return first


async def test_queued_requests_are_merged_and_each_gets_its_own_rows() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend])
    first = await _hold_first(batcher, backend)
    items = [_item(rows, float(i + 1)) for i, rows in enumerate([1, 2, 1, 3])]
    for item in items:
        batcher.submit(item)
    backend.gate.set()
    await first.future
    results = [await item.future for item in items]
    assert backend.batches == [1, 7]
    for i, (item, out) in enumerate(zip(items, results, strict=True)):
        np.testing.assert_array_equal(out["y"], np.full((item.batch_size, 4), 2 * (i + 1) + 1))
        np.testing.assert_array_equal(out["total"], np.full((item.batch_size, 1), 4 * (i + 1)))
    assert batcher.stats.execution_count == 2
    assert batcher.stats.inference_count == 8


async def test_batches_never_exceed_the_cap() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend], max_batch_size=4)
    first = await _hold_first(batcher, backend)
    items = [_item(1, 1.0) for _ in range(9)]
    for item in items:
        batcher.submit(item)
    backend.gate.set()
    await asyncio.gather(first.future, *(i.future for i in items))
    assert backend.batches == [1, 4, 4, 1]


async def test_without_dynamic_batching_each_request_runs_alone() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend], batching=False)
    first = await _hold_first(batcher, backend)
    items = [_item(2, 1.0) for _ in range(3)]
    for item in items:
        batcher.submit(item)
    backend.gate.set()
    await asyncio.gather(first.future, *(i.future for i in items))
    assert backend.batches == [1, 2, 2, 2]


async def test_a_full_queue_refuses_at_once() -> None:
    backend = FakeBackend()
    batcher = _batcher(
        [backend], extra="dynamic_batching { default_queue_policy { max_queue_size: 2 } }"
    )
    first = await _hold_first(batcher, backend)
    batcher.submit(_item(1, 1.0))
    batcher.submit(_item(1, 1.0))
    with pytest.raises(Overloaded, match="queue is full"):
        batcher.submit(_item(1, 1.0))
    backend.gate.set()
    await first.future


async def test_expired_and_abandoned_requests_never_reach_the_model() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend])
    first = await _hold_first(batcher, backend)
    expired = _item(1, 5.0, deadline_ns=time.monotonic_ns() - 1)
    abandoned = _item(2, 6.0)
    kept = _item(3, 7.0)
    for item in (expired, abandoned, kept):
        batcher.submit(item)
    abandoned.future.cancel()
    backend.gate.set()
    await first.future
    with pytest.raises(DeadlineExceeded):
        await expired.future
    out = await kept.future
    assert backend.batches == [1, 3]
    np.testing.assert_array_equal(out["y"], np.full((3, 4), 15.0))


async def test_higher_priority_runs_first() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend], max_batch_size=1, extra="dynamic_batching { priority_levels: 2 }")
    first = await _hold_first(batcher, backend)
    low = _item(1, 2.0, priority=2)
    high = _item(1, 3.0, priority=1)
    batcher.submit(low)
    batcher.submit(high)
    order: list[str] = []
    high.future.add_done_callback(lambda _: order.append("high"))
    low.future.add_done_callback(lambda _: order.append("low"))
    backend.gate.set()
    await asyncio.gather(first.future, low.future, high.future)
    assert order == ["high", "low"]


async def test_a_backend_error_reaches_every_request_of_its_batch() -> None:
    backend = FakeBackend(poison=-1.0)
    batcher = _batcher([backend])
    first = await _hold_first(batcher, backend)
    items = [_item(1, -1.0), _item(1, 2.0)]
    for item in items:
        batcher.submit(item)
    backend.gate.set()
    await first.future
    for item in items:
        with pytest.raises(BackendError, match="poisoned"):
            await item.future
    ok = _item(1, 2.0)
    batcher.submit(ok)
    assert (await ok.future)["y"][0, 0] == 5.0


async def test_instances_run_batches_concurrently() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = _batcher(backends)
    for backend in backends:
        backend.gate.clear()
    a, b = _item(1, 1.0), _item(1, 2.0)
    batcher.submit(a)
    batcher.submit(b)
    await asyncio.gather(_entered(backends[0]), _entered(backends[1]))
    assert batcher.pool.busy_count() == 2
    for backend in backends:
        backend.gate.set()
    await asyncio.gather(a.future, b.future)


async def test_close_finishes_queued_work_then_refuses() -> None:
    backend = FakeBackend()
    batcher = _batcher([backend])
    first = await _hold_first(batcher, backend)
    queued = _item(2, 1.0)
    batcher.submit(queued)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0)
    with pytest.raises(Unavailable):
        batcher.submit(_item(1, 1.0))
    backend.gate.set()
    await closing
    assert (await queued.future)["y"].shape == (2, 4)
    assert first.future.done()
