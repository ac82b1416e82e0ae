"""Who goes first: priority levels with aging, and preserve_ordering across instances."""

from __future__ import annotations

import asyncio

import pytest
from batchserve.core.errors import DeadlineExceeded
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend, ManualClock
from harness import WAIT_S, answer, answers, entered, hold_first, item, make_batcher, submit

pytestmark = pytest.mark.anyio

MS = 1_000_000
TWO_LEVELS = "dynamic_batching { priority_levels: 2 }"  # no delay: aging after 10 ms


def _completion_order(items: dict[str, WorkItem]) -> list[str]:
    order: list[str] = []
    for name, queued in items.items():
        queued.future.add_done_callback(lambda _, name=name: order.append(name))
    return order


@pytest.mark.parametrize(("waited_ms", "low_goes"), [(9, "last"), (11, "first")])
async def test_a_low_priority_request_is_served_under_sustained_high_priority_load(
    waited_ms: int, low_goes: str
) -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher([backend], clock=clock, max_batch_size=1, extra=TWO_LEVELS)
    first = await hold_first(batcher, backend, at=clock)
    low = item(1, 2.0, priority=2, at=clock)
    batcher.submit(low)
    highs: dict[str, WorkItem] = {}
    for step in range(waited_ms):  # a high-priority request every millisecond
        clock.advance(1 * MS)
        highs[f"high{step}"] = item(1, 3.0, priority=1, at=clock)
        batcher.submit(highs[f"high{step}"])
    order = _completion_order({"low": low, **highs})
    backend.gate.set()
    await answers(first, low, *highs.values())
    assert order.index("low") == (0 if low_goes == "first" else len(highs))


async def test_aged_requests_keep_their_arrival_order_against_the_top_level() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher([backend], clock=clock, max_batch_size=1, extra=TWO_LEVELS)
    first = await hold_first(batcher, backend, at=clock)
    early_high = item(1, 1.0, priority=1, at=clock)
    batcher.submit(early_high)
    clock.advance(1 * MS)
    low = item(1, 2.0, priority=2, at=clock)
    batcher.submit(low)
    clock.advance(20 * MS)
    late_high = item(1, 3.0, priority=1, at=clock)
    batcher.submit(late_high)
    order = _completion_order({"early": early_high, "low": low, "late": late_high})
    backend.gate.set()
    await answers(first, early_high, low, late_high)
    assert order == ["early", "low", "late"]


async def test_the_levels_a_config_may_declare_cost_only_those_in_use() -> None:
    """2^64-1 levels (Triton's field is a uint64) once made a FIFO each at load: the server's
    memory went until the kernel killed it."""
    clock, backend = ManualClock(), FakeBackend()
    most = 2**64 - 1
    batcher = make_batcher(
        [backend], clock=clock, max_batch_size=1,
        extra=f"dynamic_batching {{ priority_levels: {most} }}",
    )  # fmt: skip
    first = await hold_first(batcher, backend, at=clock)
    lowest, middle, top = (item(1, v, priority=p, at=clock) for v, p in
                           ((1.0, most), (2.0, 2**40), (3.0, 1)))  # fmt: skip
    for queued in (lowest, middle, top):
        batcher.submit(queued)
    assert batcher.queue._in_use == [1, 2**40, most]
    order = _completion_order({"lowest": lowest, "middle": middle, "top": top})
    backend.gate.set()
    await answers(first, lowest, middle, top)
    assert order == ["top", "middle", "lowest"]
    assert batcher.queue._levels == {}, "a level is gone once empty"


async def _two_instances_finishing_in_reverse(
    batcher: Batcher, backends: list[FakeBackend]
) -> list[str]:
    """a runs on instance 0 and b on instance 1; b finishes first, then c queues behind."""
    for backend in backends:
        backend.gate.clear()
    a, b, c = item(1, 1.0), item(1, 2.0), item(1, 3.0)
    order = _completion_order({"a": a, "b": b, "c": c})
    await submit(batcher, a, b, c)  # a and b each take a free instance, c queues
    await asyncio.gather(entered(backends[0]), entered(backends[1]))
    backends[1].gate.set()
    await entered(backends[1])  # b's batch is handled and c has taken its instance
    order.append(f"b done: {b.future.done()}")
    backends[0].gate.set()
    await answers(a, b, c)
    assert (await answer(b))["y"][0, 0] == 5.0
    return order


async def test_preserve_ordering_holds_answers_until_earlier_requests_have_theirs() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = make_batcher(backends, extra="dynamic_batching { preserve_ordering: true }")
    order = await _two_instances_finishing_in_reverse(batcher, backends)
    assert order == ["b done: False", "a", "b", "c"]


async def test_without_preserve_ordering_answers_come_as_batches_finish() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = make_batcher(backends)
    order = await _two_instances_finishing_in_reverse(batcher, backends)
    assert "b done: True" in order
    assert order.index("b") < order.index("a")


async def test_preserve_ordering_does_not_stall_behind_dropped_requests() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="dynamic_batching { preserve_ordering: true }"
    )
    first = await hold_first(batcher, backend, at=clock)
    expiring = item(1, 1.0, deadline_ns=clock() + 1 * MS, at=clock)
    abandoned = item(1, 1.0, at=clock)
    kept = item(1, 2.0, at=clock)
    for queued in (expiring, abandoned, kept):
        batcher.submit(queued)
    abandoned.future.cancel()
    clock.advance(2 * MS)
    order = _completion_order({"first": first, "expiring": expiring, "kept": kept})
    backend.gate.set()
    await answers(first, kept)
    with pytest.raises(DeadlineExceeded):
        await answer(expiring)
    assert order == ["first", "expiring", "kept"]


async def test_close_releases_every_held_answer() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = make_batcher(backends, extra="dynamic_batching { preserve_ordering: true }")
    for backend in backends:
        backend.gate.clear()
    items = [item(1, float(i)) for i in range(5)]
    for queued in items:
        batcher.submit(queued)
    await asyncio.gather(entered(backends[0]), entered(backends[1]))
    closing = asyncio.create_task(batcher.close())
    backends[1].gate.set()
    backends[0].gate.set()
    await asyncio.wait_for(closing, WAIT_S)
    assert [queued.future.result()["y"][0, 0] for queued in items] == [1.0, 3.0, 5.0, 7.0, 9.0]
