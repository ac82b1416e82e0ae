"""The dynamic batcher, driven with a fake backend whose runs the test holds and releases."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from batchserve.core.errors import DeadlineExceeded, Overloaded, Unavailable
from fakes import FakeBackend, ManualClock
from harness import (
    WAIT_S,
    answer,
    answers,
    entered,
    hold_first,
    item,
    make_batcher,
    request,
    submit,
)

pytestmark = pytest.mark.anyio


async def test_queued_requests_are_merged_and_each_gets_its_own_rows() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    items = [item(rows, float(i + 1)) for i, rows in enumerate([1, 2, 1, 3])]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answer(first)
    results = [await answer(queued) for queued in items]
    assert backend.batches == [1, 7]
    for i, (queued, out) in enumerate(zip(items, results, strict=True)):
        np.testing.assert_array_equal(out["y"], np.full((queued.batch_size, 4), 2 * (i + 1) + 1))
        np.testing.assert_array_equal(out["total"], np.full((queued.batch_size, 1), 4 * (i + 1)))
    assert batcher.stats.execution_count == 2
    assert batcher.stats.inference_count == 8
    assert batcher.stats.padding_elements == 0
    assert batcher.stats.input_elements == 8 * 4


async def test_batches_never_exceed_the_cap() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend], max_batch_size=4)
    first = await hold_first(batcher, backend)
    items = [item(1, 1.0) for _ in range(9)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, *items)
    assert backend.batches == [1, 4, 4, 1]


async def test_without_dynamic_batching_each_request_runs_alone() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend], batching=False)
    first = await hold_first(batcher, backend)
    items = [item(2, 1.0) for _ in range(3)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, *items)
    assert backend.batches == [1, 2, 2, 2]


async def test_a_full_queue_refuses_at_once() -> None:
    backend = FakeBackend()
    batcher = make_batcher(
        [backend], extra="dynamic_batching { default_queue_policy { max_queue_size: 2 } }"
    )
    first = await hold_first(batcher, backend)
    batcher.submit(item(1, 1.0))
    batcher.submit(item(1, 1.0))
    with pytest.raises(Overloaded, match="queue is full"):
        batcher.submit(item(1, 1.0))
    backend.gate.set()
    await answer(first)


async def test_a_level_with_its_own_queue_policy_is_bounded_on_its_own() -> None:
    """Triton's priority_queue_policy: level 2 holds one waiting request; level 1 still
    queues under the model's bound."""
    backend = FakeBackend()
    batcher = make_batcher(
        [backend],
        extra="dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 2 value: { max_queue_size: 1 } } }",
    )
    first = await hold_first(batcher, backend)
    low = item(1, 1.0, priority=2)
    batcher.submit(low)
    with pytest.raises(Overloaded, match=r"^Exceeds maximum queue size \(batchserve: .* 1 "
                       "requests of priority level 2 waiting"):  # fmt: skip
        batcher.submit(item(1, 1.0, priority=2))
    high = [item(1, 1.0, priority=1) for _ in range(3)]
    for queued in high:
        batcher.submit(queued)
    low.future.cancel()  # its place is free again
    batcher.submit(again := item(1, 1.0, priority=2))
    backend.gate.set()
    await answers(first, *high, again)


async def test_expired_and_abandoned_requests_never_reach_the_model() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    expired = item(1, 5.0, deadline_ns=time.monotonic_ns() - 1)
    abandoned = item(2, 6.0)
    gone = item(2, 6.0)
    gone.is_cancelled = lambda: True  # the client went away without cancelling the future
    kept = item(3, 7.0)
    for queued in (expired, abandoned, gone, kept):
        batcher.submit(queued)
    abandoned.future.cancel()
    backend.gate.set()
    await answer(first)
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired \(batchserve: "):
        await answer(expired)  # Triton's words first (its dynamic batcher's)
    out = await answer(kept)
    assert backend.batches == [1, 3]
    np.testing.assert_array_equal(out["y"], np.full((3, 4), 15.0))
    assert gone.future.cancelled()  # resolved, so nobody awaits it forever


async def test_a_queued_request_is_answered_at_its_deadline_while_the_instance_is_busy() -> None:
    """Not when an instance is next free to look at the queue, and wherever it is queued;
    the requests around it keep their places."""
    backend = FakeBackend()
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    patient = item(1, 6.0, deadline_ns=time.monotonic_ns() + 10**10)
    late = item(1, 5.0, deadline_ns=time.monotonic_ns() + 50_000_000)
    batcher.submit(patient)
    batcher.submit(late)
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired"):
        await asyncio.wait_for(late.future, WAIT_S)
    assert not backend.gate.is_set()  # the instance is still busy with the first batch
    assert not patient.future.done()
    assert len(batcher.queue) == 1
    backend.gate.set()
    await answer(first)
    assert (await answer(patient))["y"].shape == (1, 4)


async def test_higher_priority_runs_first() -> None:
    backend = FakeBackend()
    batcher = make_batcher(
        [backend], max_batch_size=1, extra="dynamic_batching { priority_levels: 2 }"
    )
    first = await hold_first(batcher, backend)
    low = item(1, 2.0, priority=2)
    high = item(1, 3.0, priority=1)
    batcher.submit(low)
    batcher.submit(high)
    order: list[str] = []
    high.future.add_done_callback(lambda _: order.append("high"))
    low.future.add_done_callback(lambda _: order.append("low"))
    backend.gate.set()
    await answers(first, low, high)
    assert order == ["high", "low"]


async def test_instances_run_batches_concurrently() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = make_batcher(backends)
    for backend in backends:
        backend.gate.clear()
    a, b = item(1, 1.0), item(1, 2.0)
    batcher.submit(a)
    batcher.submit(b)
    await asyncio.gather(entered(backends[0]), entered(backends[1]))
    assert batcher.pool.busy_count() == 2
    for backend in backends:
        backend.gate.set()
    await answers(a, b)


async def test_close_finishes_queued_work_then_refuses() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    queued = item(2, 1.0)
    batcher.submit(queued)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0)
    with pytest.raises(Unavailable):
        batcher.submit(item(1, 1.0))
    backend.gate.set()
    await asyncio.wait_for(closing, WAIT_S)
    assert (await answer(queued))["y"].shape == (2, 4)
    assert first.future.done()


async def test_close_does_not_wait_out_the_queue_delay() -> None:
    clock = ManualClock()
    backend = FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }"
    )
    first = await hold_first(batcher, backend, at=clock)
    waiting = []
    for _ in range(3):  # arriving 10 us apart: more company is expected soon
        clock.advance(10_000)
        waiting.append(item(1, 2.0, at=clock))
        await submit(batcher, waiting[-1])
    backend.gate.set()
    await answer(first)
    assert len(batcher.queue) == 3  # waiting for company, a minute of delay on the clock
    # The clock never moves: closing dispatches at once.
    await asyncio.wait_for(batcher.close(), WAIT_S)
    assert backend.batches == [1, 3]
    assert all(queued.future.done() for queued in waiting)
    assert clock.pending == []


async def test_close_without_any_instance_answers_what_is_queued() -> None:
    batcher = make_batcher([])
    stranded = item(1, 1.0)
    batcher.submit(stranded)
    await asyncio.wait_for(batcher.close(), WAIT_S)
    with pytest.raises(Unavailable, match="unloaded"):
        await answer(stranded)


async def test_requests_with_different_optional_inputs_run_in_separate_batches() -> None:
    """One request sends an optional input and the next leaves it out: never one batch."""
    backend = FakeBackend()
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    x = np.ones((1, 4), dtype=np.float32)
    with_bias = request({"x": x, "bias": x})
    without = request({"x": x})
    batcher.submit(with_bias)
    batcher.submit(without)
    backend.gate.set()
    await answers(first, with_bias, without)
    assert backend.batches == [1, 1, 1]
