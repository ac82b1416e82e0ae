"""Instances joining and leaving a batcher that is serving (an instance change without a
reload): a joiner takes queued work at once, a leaver takes no new batch and finishes the
one it runs, and the batch cap follows the memory budget."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from batchserve.scheduler.instances import Instance
from fakes import FakeBackend
from harness import answers, entered, expected, hold_first, item, make_batcher, submit

pytestmark = pytest.mark.anyio


async def test_a_new_instance_takes_the_queued_requests_at_once() -> None:
    busy, joining = FakeBackend(), FakeBackend()
    batcher = make_batcher([busy])
    first = await hold_first(batcher, busy)
    queued = [item(1, float(n)) for n in range(1, 4)]
    await submit(batcher, *queued)
    assert len(batcher.queue) == 3, "one instance, and it is busy"
    batcher.add_instance(Instance("joined", joining), [(1, 1000)])
    results = await answers(*queued)
    assert joining.batches == [3], "the queue went to the new instance as one batch"
    for one, result in zip(queued, results, strict=True):
        np.testing.assert_array_equal(result["y"], expected(one.inputs["x"])["y"])
    busy.gate.set()
    await answers(first)
    assert batcher.batch_time("joined").predict(1) > 0, "seeded from its load's runs"


async def test_a_leaving_instance_finishes_its_batch_and_takes_no_other() -> None:
    staying, leaving = FakeBackend(), FakeBackend()
    batcher = make_batcher([leaving, staying])
    held = await hold_first(batcher, leaving)  # the first free instance takes it
    removal = asyncio.ensure_future(batcher.remove_instance(batcher.pool.instances[0]))
    await asyncio.sleep(0.05)
    assert not removal.done(), "it waits for the batch in flight"
    later = [item(1, float(n)) for n in range(1, 4)]
    await submit(batcher, *later)
    await answers(*later)
    assert leaving.batches == [], "no new batch reached the instance leaving"
    assert sum(staying.batches) == 3
    leaving.gate.set()
    await asyncio.wait_for(removal, 5)
    np.testing.assert_array_equal((await answers(held))[0]["y"], expected(held.inputs["x"])["y"])
    assert [i.backend for i in batcher.pool.instances] == [staying]
    assert batcher.pool.busy_count() == 0


async def test_a_free_instance_leaves_at_once() -> None:
    batcher = make_batcher([FakeBackend(), FakeBackend()])
    leaving = batcher.pool.instances[1]
    await asyncio.wait_for(batcher.remove_instance(leaving), 1)
    assert leaving not in batcher.pool.free()
    assert len(batcher.pool.instances) == 1


async def test_the_cap_follows_the_budget_but_stays_as_low_as_running_out_of_memory_set_it() -> (
    None
):
    backend = FakeBackend(oom_above=4)
    batcher = make_batcher([backend])
    assert batcher.cap == 8
    batcher.set_max_batch_size(6)
    assert (batcher.cap, batcher.policy.max_batch_size) == (6, 6)
    backend.gate.clear()
    blocked = item(1, 0.0)
    batcher.submit(blocked)
    await entered(backend)
    burst = [item(1, float(n)) for n in range(6)]
    await submit(batcher, *burst)
    backend.gate.set()
    await answers(blocked, *burst)
    learned = batcher.cap
    assert learned <= 4, "a batch of 6 ran out of memory"
    batcher.set_max_batch_size(8)  # an instance left: the budget allows more again
    assert (batcher.cap, batcher.policy.max_batch_size) == (learned, 8)
    batcher.set_max_batch_size(2)
    assert batcher.cap == 2
