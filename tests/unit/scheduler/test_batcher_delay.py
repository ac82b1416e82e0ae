"""``max_queue_delay``: Triton's dispatch rules, and not waiting when no company can come.

Time is a ManualClock: nothing moves unless the test advances it. The batcher dispatches
once per event-loop pass; ``harness.submit`` submits in a pass of its own and returns once
that dispatch has happened, so whether a request was dispatched is visible then. Company
is only expected from arrivals that found others queued (``DispatchTiming``, whose rules
``test_dispatch_timing.py`` checks on their own).
"""

from __future__ import annotations

import numpy as np
import pytest
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.dispatch_timing import DispatchTiming
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend, ManualClock, fake_config
from harness import answer, answers, hold_first, item, make_batcher, request, submit

pytestmark = pytest.mark.anyio

US = 1_000
MS = 1_000_000
WAIT_OUT = "batchserve { wait_out_queue_delay: true }"


def _delayed(clock: ManualClock, backend: FakeBackend, delay_us: int = 1000) -> Batcher:
    extra = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}"
    return make_batcher([backend], clock=clock, extra=extra)


def _timing(batcher: Batcher) -> DispatchTiming:
    assert batcher._timing is not None
    return batcher._timing


async def _company(
    batcher: Batcher, backend: FakeBackend, clock: ManualClock, gap_ns: int, count: int
) -> None:
    """A history of ``count`` arrivals ``gap_ns`` apart that met others in the queue (the
    instance was busy); then the instance frees and the clock moves on by ``gap_ns``.

    Their clients are already gone, so they shape the expected gap and cost nothing else.
    """
    first = await hold_first(batcher, backend, at=clock)
    for _ in range(count):
        clock.advance(gap_ns)
        gone = item(1, 1.0, at=clock)
        gone.future.cancel()
        await submit(batcher, gone)
    backend.gate.set()
    await answer(first)
    assert not batcher.queue
    _timing(batcher).returning = 0  # its client is gone too: nobody answered is expected
    clock.advance(gap_ns)


async def test_a_lone_request_on_an_idle_model_does_not_wait() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1_000_000)
    lone = item(1, 1.0, at=clock)
    await submit(batcher, lone)
    assert batcher.pool.busy_count() == 1  # dispatched in its own loop pass, the clock unmoved
    assert (await answer(lone))["y"][0, 0] == 3.0
    assert clock.pending == []


@pytest.mark.parametrize(
    ("gap_us", "wake_after_us"),
    [(100, 200), (900, 1000), (1100, None), (5000, None)],
)
async def test_a_request_waits_only_if_company_can_come_within_the_delay(
    gap_us: int, wake_after_us: int | None
) -> None:
    """Waits until the delay is out or the arrivals stop for QUIET_GAPS expected gaps,
    whichever is sooner; not at all when the expected gap is longer than the delay."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, gap_us * US, 5)
    probe = item(1, 2.0, at=clock)
    await submit(batcher, probe)
    if wake_after_us is None:
        assert batcher.pool.busy_count() == 1
        assert clock.pending == []
    else:
        assert batcher.pool.busy_count() == 0
        assert clock.pending == [probe.enqueued_ns + wake_after_us * US]
    clock.advance(1 * MS)
    assert (await answer(probe))["y"][0, 0] == 5.0


async def test_a_burst_goes_when_it_stops() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 10 * US, 4)
    burst = []
    for _ in range(3):
        burst.append(item(1, 2.0, at=clock))
        await submit(batcher, burst[-1])
        clock.advance(10 * US)
    clock.advance(20 * US - 10 * US - 1)  # one nanosecond short of two gaps of silence
    assert len(batcher.queue) == 3
    clock.advance(1)
    assert not batcher.queue
    await answers(*burst)
    assert backend.batches[-1] == 3


async def _burst(batcher: Batcher, clock: ManualClock, count: int, gap_ns: int) -> list:
    burst = []
    for _ in range(count):
        burst.append(item(1, 2.0, at=clock))
        await submit(batcher, burst[-1])
        clock.advance(gap_ns)
    return burst


async def test_a_batch_goes_once_every_answered_client_is_back() -> None:
    """Closed-loop clients that were just answered are about to ask again (over gRPC the
    answers leave one per loop pass, so arrivals pause meanwhile): a pause is not quiet
    while some are still to come, and once the last is back nobody else is coming."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 10 * US, 4)  # expected gap 10 us
    first = await _burst(batcher, clock, 3, 10 * US)
    clock.advance(20 * US)  # quiet: these three go
    await answers(*first)
    assert backend.batches[-1] == 3
    assert _timing(batcher).returning == 3
    again = await _burst(batcher, clock, 2, 10 * US)
    clock.advance(100 * US)  # ten gaps of silence, but one answered client is not back
    assert len(batcher.queue) == 2
    again += await _burst(batcher, clock, 1, 0)
    assert not batcher.queue  # the last one is back: the batch goes at once
    await answers(*again)
    assert backend.batches[-1] == 3


async def test_items_carrying_several_clients_count_each_client_once() -> None:
    """A worker's group is one item answering several clients; they come back in items
    grouped differently, and the batch goes as soon as all of them are back."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 10 * US, 4)
    first = await _burst(batcher, clock, 2, 10 * US)
    for carried, group in zip((3, 2), first, strict=True):
        group.clients = carried
    clock.advance(20 * US)
    await answers(*first)
    assert _timing(batcher).returning == 5
    back = item(1, 2.0, at=clock)
    back.clients = 4
    await submit(batcher, back)
    clock.advance(100 * US)  # quiet for ten gaps, but one client is still to come
    assert len(batcher.queue) == 1
    last = item(1, 2.0, at=clock)
    await submit(batcher, last)
    assert not batcher.queue  # the fifth is back: it goes at once
    await answers(back, last)


async def test_all_back_holds_only_for_the_requests_queued_when_it_happened() -> None:
    """A batch that went at a preferred size took the clients that were back with it: the
    next answered clients are waited for again."""
    clock, backend = ManualClock(), FakeBackend()
    extra = "dynamic_batching { max_queue_delay_microseconds: 1000 preferred_batch_size: [2] }"
    batcher = make_batcher([backend], clock=clock, extra=extra)
    await _company(batcher, backend, clock, 10 * US, 4)
    first = await _burst(batcher, clock, 2, 10 * US)  # a preferred size: goes at once
    await answers(*first)
    second = await _burst(batcher, clock, 2, 10 * US)  # both back, and a preferred size
    await answers(*second)
    assert _timing(batcher).returning == 2
    third = await _burst(batcher, clock, 1, 10 * US)
    clock.advance(100 * US)  # ten gaps of silence: one answered client is not back
    assert len(batcher.queue) == 1
    third += await _burst(batcher, clock, 1, 0)
    assert not batcher.queue
    await answers(*third)
    assert backend.batches[-1] == 2


async def test_answered_clients_that_never_come_back_cost_one_delay_at_most() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 10 * US, 4)
    first = await _burst(batcher, clock, 3, 10 * US)
    clock.advance(20 * US)  # quiet: these three go
    await answers(*first)
    clock.advance(20 * US)
    stayed = await _burst(batcher, clock, 1, 0)  # the other two answered clients left
    clock.advance(MS // 2)  # fifty gaps of silence
    assert len(batcher.queue) == 1
    clock.advance(MS // 2)  # the delay is out: it goes, and they are no longer waited for
    await answers(*stayed)
    assert _timing(batcher).returning == 1  # only the client just answered is waited for
    assert _timing(batcher).overdue == 2  # the two others: late or gone, not yet known
    for still_overdue in (1, 0):
        back = await _burst(batcher, clock, 1, 0)
        assert len(batcher.queue) == 1  # not every client is back: it waits for quiet
        wake = clock.pending[0]
        assert wake < back[0].enqueued_ns + MS  # quiet, not another delay
        clock.advance(wake - clock())
        assert not batcher.queue
        await answers(*back)
        assert _timing(batcher).overdue == still_overdue  # half those missing count as gone
    back = await _burst(batcher, clock, 1, 0)
    assert not batcher.queue  # nobody else is counted now: that client back, it goes at once
    await answers(*back)


async def test_a_steady_stream_goes_when_the_oldest_delay_is_out() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=50)
    await _company(batcher, backend, clock, 10 * US, 4)
    stream = []
    for index in range(5):  # never quiet: each arrival 10 us after the last
        if index:
            clock.advance(10 * US)
        stream.append(item(1, 2.0, at=clock))
        await submit(batcher, stream[-1])
    assert len(batcher.queue) == 5  # 40 us after the first
    clock.advance(10 * US)  # 50 us: the first one's delay is out
    assert not batcher.queue
    await answers(*stream)
    assert backend.batches[-1] == 5


async def test_after_the_load_has_gone_lone_requests_soon_stop_waiting() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 10 * US, 8)  # a busy spell, arrivals 10 us apart
    waited = []
    for _ in range(30):  # then one client alone: nobody ever joins its requests
        clock.advance(5 * MS)
        lone = item(1, 1.0, at=clock)
        await submit(batcher, lone)
        waited.append(batcher.pool.busy_count() == 0)
        clock.advance(1 * MS)
        await answer(lone)
    assert waited[0]
    assert not any(waited[20:])  # the fruitless waits taught it that nobody comes


async def test_a_lone_client_never_waits_however_often_it_asks() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    for _ in range(20):  # closed loop: one request at a time, 100 us apart
        lone = item(1, 1.0, at=clock)
        await submit(batcher, lone)
        assert batcher.pool.busy_count() == 1
        assert clock.pending == []
        await answer(lone)
        clock.advance(100 * US)


async def test_the_largest_preferred_size_reached_goes_at_once() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 "
        "preferred_batch_size: [2, 4] }",
    )
    first = await hold_first(batcher, backend, at=clock)
    items = []
    for i in range(7):  # 10 us apart: more company is expected soon
        clock.advance(10 * US)
        items.append(item(1, float(i), at=clock))
        await submit(batcher, items[-1])
    backend.gate.set()
    await answers(first, *items[:6])
    assert backend.batches == [1, 4, 2]  # 7 queued: the largest preferred, then 2 of 3
    assert len(batcher.queue) == 1
    clock.advance(60_000 * MS)
    await answer(items[6])
    assert backend.batches == [1, 4, 2, 1]


# preferred [max]: what Triton's normalization (and batchserve's) writes where none is given,
# so it must batch exactly as no preferred size does
@pytest.mark.parametrize("preferred", ["", "preferred_batch_size: [4]"], ids=["none", "max"])
async def test_a_full_batch_goes_at_once_and_the_rest_waits(preferred: str) -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        max_batch_size=4,
        extra=f"dynamic_batching {{ max_queue_delay_microseconds: 60000000 {preferred} }}",
    )
    first = await hold_first(batcher, backend, at=clock)
    items = []
    for rows in (1, 2, 2, 1):  # 10 us apart: more company is expected soon
        clock.advance(10 * US)
        items.append(item(rows, 1.0, at=clock))
        await submit(batcher, items[-1])
    backend.gate.set()
    await answers(first, items[0], items[1])
    assert backend.batches == [1, 3]  # 1 + 2 = 3: the next 2 would pass the cap of 4
    assert len(batcher.queue) == 2
    clock.advance(60_000 * MS)
    await answers(items[2], items[3])
    assert backend.batches == [1, 3, 3]


async def test_a_request_larger_than_every_preferred_size_does_not_wait() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend],
        clock=clock,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 "
        "preferred_batch_size: [2] }",
    )
    first = await hold_first(batcher, backend, at=clock)
    big = item(3, 1.0, at=clock)
    await submit(batcher, big)
    backend.gate.set()
    await answers(first, big)
    assert backend.batches == [1, 3]


async def test_without_a_delay_batches_are_greedy() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="dynamic_batching { preferred_batch_size: [4] }"
    )
    first = await hold_first(batcher, backend, at=clock)
    items = [item(1, 1.0, at=clock) for _ in range(3)]
    for queued in items:
        await submit(batcher, queued)
    backend.gate.set()
    await answers(first, *items)
    assert backend.batches == [1, 3]
    assert clock.pending == []


@pytest.mark.parametrize(("queued", "batches"), [(5, [1, 4, 1]), (7, [1, 6, 1]), (3, [1, 3])])
async def test_without_a_delay_the_largest_preferred_size_reached_goes_first(
    queued: int, batches: list[int]
) -> None:
    """Triton's rule with no queue delay (its L0_batcher ``test_preferred_batch_only_*``):
    the queue reaching a preferred size sends the largest one reached, the rest next; short
    of every preferred size, all of it."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="dynamic_batching { preferred_batch_size: [4, 6] }"
    )
    first = await hold_first(batcher, backend, at=clock)
    items = [item(1, 1.0, at=clock) for _ in range(queued)]
    for one in items:
        await submit(batcher, one)
    backend.gate.set()
    await answers(first, *items)
    assert backend.batches == batches
    assert clock.pending == []


@pytest.mark.parametrize(("overdue", "batches"), [(True, [1, 8]), (False, [1, 3])])
async def test_once_the_oldest_has_waited_the_delay_the_batch_takes_all_up_to_the_cap(
    overdue: bool, batches: list[int]
) -> None:
    """Triton's rule (its L0_batcher ``test_multi_batch_delayed_use_max_batch``): 3 + 4
    rows pass the largest preferred size (6), so 3 go first while the delay runs; once the
    oldest has waited it all, preferred sizes no longer bound the batch: 3 + 4 + 1 go as
    one batch of the cap (8)."""
    clock, backend = ManualClock(), FakeBackend()
    extra = "dynamic_batching { max_queue_delay_microseconds: 10000 preferred_batch_size: [2, 6] }"
    batcher = make_batcher([backend], clock=clock, max_batch_size=8, extra=extra)
    first = await hold_first(batcher, backend, at=clock)
    three, four, one = item(3, 1.0, at=clock), item(4, 1.0, at=clock), item(1, 1.0, at=clock)
    await submit(batcher, three, four)
    if overdue:
        clock.advance(10 * MS)
    await submit(batcher, one)
    backend.gate.set()
    await answers(first, three)
    assert backend.batches[: len(batches)] == batches
    clock.advance(10 * MS)
    await answers(four, one)


async def test_the_scheduler_delay_holds_the_first_batch_until_enough_are_queued() -> None:
    """``--delay-scheduler 3`` (Triton's ``TRITONSERVER_DELAY_SCHEDULER``, for tests): an
    idle model runs nothing until three requests are queued, then batches them together;
    the hold is over after that."""
    clock, backend = ManualClock(), FakeBackend()
    policy = BatchPolicy.from_config(fake_config(""), 64, delay_scheduler=3)
    pool = InstancePool([Instance("fake-0", backend)])
    batcher = Batcher(pool, policy, ModelStats(), clock=clock, timer=clock)
    held = [item(1, float(i), at=clock) for i in range(3)]
    await submit(batcher, held[0], held[1])
    assert batcher.pool.busy_count() == 0
    assert len(batcher.queue) == 2
    await submit(batcher, held[2])
    await answers(*held)
    assert backend.batches == [3]
    lone = item(1, 5.0, at=clock)
    await submit(batcher, lone)
    assert (await answer(lone))["y"][0, 0] == 11.0
    assert backend.batches == [3, 1]


async def test_an_urgent_item_takes_the_waiting_requests_with_it_at_once() -> None:
    """A generation loop's step waits for nobody: it and whatever is queued go now."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    await _company(batcher, backend, clock, 100 * US, 5)
    waiting = item(1, 2.0, at=clock)
    await submit(batcher, waiting)
    assert batcher.pool.busy_count() == 0  # it waits for company, as above
    step = item(2, 1.0, at=clock)
    step.urgent = True
    await submit(batcher, step)
    assert batcher.pool.busy_count() == 1  # the clock unmoved
    assert (await answer(step))["y"].shape == (2, 4)
    await answer(waiting)
    assert backend.batches[-1] == 3
    assert batcher._urgent == 0


async def test_requests_received_long_before_they_queue_never_set_a_wake_up_in_the_past() -> None:
    """A sequence's step reaches the queue only once the step before it has run, stamped
    with when it was received, so stamps need not follow the order of arrival. Taken as
    arrival gaps, such stamps once made the expected gap negative: every wait ended before
    it began, the batcher set its wake-up in the past again and again and spun on the CPU,
    and the queued steps never went."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _delayed(clock, backend, delay_us=1000)
    first = await hold_first(batcher, backend, at=clock)
    received = clock()
    steps = []
    for step in range(8):  # each queued 50 us after the last, each received 100 us earlier
        clock.advance(50 * US)
        steps.append(item(1, float(step), at=clock))
        steps[-1].enqueued_ns = received - step * 100 * US
        await submit(batcher, steps[-1])
    assert _timing(batcher).gaps.expected_gap_ns() == 50 * US
    backend.gate.set()
    await answer(first)
    assert all(when > clock() for when in clock.pending)
    clock.advance(1 * MS)
    await answers(*steps)
    assert not batcher.queue


@pytest.mark.parametrize("how", ["config", "server"])
async def test_waiting_out_the_delay_holds_a_lone_request_the_whole_delay_as_triton(
    how: str,
) -> None:
    """``batchserve { wait_out_queue_delay }`` or the server's ``--wait-out-queue-delay``:
    Triton's rule, so four requests spread over most of a 1 s delay share one batch on an
    idle model (Triton's L0_batch_input asserts it), where by default the first goes alone."""
    clock, backend = ManualClock(), FakeBackend()
    extra = "dynamic_batching { max_queue_delay_microseconds: 1000000 }"
    if how == "config":
        extra += " batchserve { wait_out_queue_delay: true }"
        batcher = make_batcher([backend], clock=clock, extra=extra)
    else:
        policy = BatchPolicy.from_config(fake_config(extra), 64, wait_out_queue_delay=True)
        pool = InstancePool([Instance("fake-0", backend)])
        batcher = Batcher(pool, policy, ModelStats(), clock=clock, timer=clock)
    four = []
    for _ in range(4):
        four.append(item(1, 2.0, at=clock))
        await submit(batcher, four[-1])
        assert batcher.pool.busy_count() == 0
        clock.advance(200 * MS)
    assert clock.pending == [four[0].enqueued_ns + 1000 * MS]
    clock.advance(200 * MS)  # the first request has now waited the whole delay
    await answers(*four)
    assert backend.batches == [4]


def _width(width: int, clock: ManualClock) -> WorkItem:
    return request({"x": np.full((1, width), 1.0, dtype=np.float32)}, at=clock)


async def test_a_batch_a_queued_request_cannot_join_goes_without_waiting() -> None:
    """Triton's rule, under its own waiting too: a request of other shapes queued behind
    the head means the head's batch cannot grow (later arrivals queue behind that one), so
    it goes at once, and the other waits for its own company."""
    clock, backend = ManualClock(), FakeBackend()
    extra = "dynamic_batching { max_queue_delay_microseconds: 1000000 } "
    batcher = make_batcher([backend], clock=clock, extra=extra + WAIT_OUT)
    first, same = _width(4, clock), _width(4, clock)
    await submit(batcher, first)
    await submit(batcher, same)
    assert batcher.pool.busy_count() == 0  # both wait, as Triton's rule says
    clock.advance(10 * MS)
    other = _width(5, clock)
    await submit(batcher, other)
    await answers(first, same)
    assert backend.shapes == [(2, 4)]  # went at once: 10 ms into a 1 s delay
    assert len(batcher.queue) == 1
    clock.advance(1000 * MS)
    await answers(other)
    assert backend.shapes == [(2, 4), (1, 5)]


async def test_the_request_left_behind_waits_for_its_own_company() -> None:
    """Once the batch ahead of it has gone, the request of other shapes heads the queue:
    nothing queued behind it differs, so it waits out the delay (Triton's rule) rather than
    going at once."""
    clock, backend = ManualClock(), FakeBackend()
    extra = "dynamic_batching { max_queue_delay_microseconds: 1000000 } "
    batcher = make_batcher([backend], clock=clock, max_batch_size=2, extra=extra + WAIT_OUT)
    queued = [_width(4, clock), _width(4, clock), _width(5, clock)]
    await submit(batcher, *queued)
    await answers(queued[0], queued[1])  # full at the cap: at once
    assert backend.shapes == [(2, 4)]
    clock.advance(999 * MS)
    await submit(batcher)  # a pass of the loop: nothing is due yet
    assert len(batcher.queue) == 1
    clock.advance(1 * MS)
    await answers(queued[2])
    assert backend.shapes == [(2, 4), (1, 5)]
