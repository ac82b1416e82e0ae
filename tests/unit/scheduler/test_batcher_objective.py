"""Objective-driven dispatch: a batch waits for company only while its oldest request can
still finish within the latency objective, given the predicted time of its batch; late
requests are served or refused at once, by a switch.

Time is a ManualClock (see ``test_batcher_delay.py``); the batch-time model is seeded by hand,
as the memory probe seeds it at load.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from batchserve.core.errors import Unavailable
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.batch_time import FORGET
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.dispatch_timing import DispatchTiming
from batchserve.scheduler.objective_plan import OBJECTIVE_MARGIN, ArrivalRate
from batchserve.scheduler.overrun import REFRESH
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend, ManualClock, fake_config
from harness import (
    answer,
    answers,
    batcher_for,
    hold_first,
    item,
    make_batcher,
    outcomes,
    request,
    submit,
)

pytestmark = pytest.mark.anyio

US = 1_000
MS = 1_000_000
OBJECTIVE = 10 * MS


def _objective(
    clock: ManualClock, backend: FakeBackend, *, refuse: bool = False, extra: str = ""
) -> Batcher:
    config = (
        f"batchserve {{ latency_objective_microseconds: {OBJECTIVE // US} "
        f"refuse_late_requests: {str(refuse).lower()} }} {extra}"
    )
    return make_batcher([backend], clock=clock, extra=config)


def _timing(batcher: Batcher) -> DispatchTiming:
    assert batcher._timing is not None
    return batcher._timing


def _company(batcher: Batcher, clock: ManualClock, gap_ns: int) -> None:
    """Arrivals ``gap_ns`` apart that met others, as learned from earlier traffic."""
    gaps = _timing(batcher).gaps
    for _ in range(5):
        gaps.arrival(clock(), joined=True)
        clock.advance(gap_ns)


async def _lone_request_waiting(clock: ManualClock) -> tuple[Batcher, WorkItem]:
    """A request queued alone with company expected every 5 ms, batches predicted at 0.5 ms
    plus 0.5 ms a sample."""
    batcher = _objective(clock, FakeBackend())
    batcher.seed_batch_times("fake-0", [(1, 1 * MS), (4, 2500 * US)])
    _company(batcher, clock, 5 * MS)
    first = item(1, 1.0, at=clock)
    await submit(batcher, first)
    return batcher, first


async def test_a_waiting_batch_goes_when_its_oldest_request_would_otherwise_be_late() -> None:
    clock = ManualClock()
    batcher, first = await _lone_request_waiting(clock)
    assert batcher.pool.busy_count() == 0  # company is expected before the objective is at risk
    predicted = batcher.batch_time("fake-0").predict(2)  # were one more to join
    assert predicted == pytest.approx(1500 * US, abs=1)
    allowed = int(OBJECTIVE * (1 - OBJECTIVE_MARGIN))
    assert clock.pending == [first.enqueued_ns + allowed - predicted]  # 7.5 ms: past any delay
    clock.advance(allowed - predicted)
    assert batcher.pool.busy_count() == 1
    assert (await answer(first))["y"][0, 0] == 3.0


async def test_a_batch_woken_late_plans_its_finish_from_its_due_time() -> None:
    clock = ManualClock()
    batcher, first = await _lone_request_waiting(clock)
    (due,) = clock.pending
    predicted = batcher.batch_time("fake-0").predict(1)
    clock.advance(due - clock() + 300 * US)  # the wake-up fired 0.3 ms late (a busy loop)
    assert first.dispatched_ns == due + 300 * US
    assert first.planned_finish_ns == due + predicted  # so the lateness counts as overrun
    await answer(first)


async def test_overruns_teach_a_margin_that_waiting_batches_keep_free() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _objective(clock, backend)
    batcher.seed_batch_times("fake-0", [(1, 1 * MS), (4, 2500 * US)])
    answered = item(1, 0.0, at=clock)
    answered.planned_finish_ns = clock()
    for _ in range(REFRESH - 1):
        batcher.answered(answered, clock() + 1500 * US)
    assert batcher.stats.objective_margin_ns == 0  # too few answers to tell yet
    batcher.answered(answered, clock() + 1500 * US)
    assert batcher.stats.objective_margin_ns == 1500 * US
    _company(batcher, clock, 5 * MS)
    waiting = item(1, 2.0, at=clock)
    await submit(batcher, waiting)
    allowed = int(OBJECTIVE * (1 - OBJECTIVE_MARGIN))
    predicted = batcher.batch_time("fake-0").predict(2)
    assert clock.pending == [waiting.enqueued_ns + allowed - 1500 * US - predicted]
    clock.advance(clock.pending[0] - clock())
    assert (await answer(waiting))["y"][0, 0] == 5.0


async def test_the_margin_never_takes_more_than_half_the_time_a_batch_has_to_spare() -> None:
    clock = ManualClock()
    batcher = _objective(clock, FakeBackend())
    batcher.seed_batch_times("fake-0", [(1, 1 * MS), (4, 2500 * US)])
    allowed = int(OBJECTIVE * (1 - OBJECTIVE_MARGIN))
    spare = allowed - batcher.batch_time("fake-0").predict(1)  # 8 ms, the queue empty
    answered = item(1, 0.0, at=clock)
    answered.planned_finish_ns = clock()
    for overrun, kept in ((1 * MS, 1 * MS), (20 * MS, spare // 2)):
        for _ in range(REFRESH):  # 20 ms: a loop far behind
            batcher.answered(answered, clock() + overrun)
        assert batcher.stats.objective_margin_ns == overrun
        # far behind, a batch still waits for company half of what it could: shorter waits,
        # smaller batches and more loop time a request would make the loop later still
        assert batcher._objective_due(clock(), clock()) == clock() + spare - kept


async def test_without_an_objective_no_finish_is_planned_and_no_margin_learned() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend], clock=ManualClock())
    one = item(1, 1.0)
    await submit(batcher, one)
    await answer(one)
    assert one.planned_finish_ns == 0
    for _ in range(REFRESH):
        batcher.answered(one, 10 * MS)
    assert batcher.stats.objective_margin_ns == 0


async def test_a_batch_goes_at_once_when_its_predicted_time_leaves_no_room() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _objective(clock, backend)
    batcher.seed_batch_times("fake-0", [(1, 9 * MS), (4, 12 * MS)])
    _company(batcher, clock, 1 * MS)
    lone = item(1, 1.0, at=clock)
    await submit(batcher, lone)
    assert batcher.pool.busy_count() == 1
    assert clock.pending == []
    await answer(lone)


def _arrivals(batcher: Batcher, clock: ManualClock, gap_ns: int) -> None:
    """Recent traffic: eight arrivals ``gap_ns`` apart, counted in a window of the rate."""
    assert batcher._objective is not None
    rate = batcher._objective.rate
    rate.per_ns(clock())  # opens a window (closing the one before, if any)
    for _ in range(8):
        rate.samples += 1
        clock.advance(gap_ns)


@pytest.mark.parametrize(
    ("arrival_gap_ns", "waits"),
    [
        (10 * MS, False),  # ~110/s of 2 ms batches: the instance busy a fifth of the time
        (1 * MS, True),  # ~1,100/s: saturated, company pays
    ],
)
async def test_a_batch_waits_for_company_only_while_its_instances_are_short_of_time(
    arrival_gap_ns: int, waits: bool
) -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _objective(clock, backend)
    batcher.seed_batch_times("fake-0", [(1, 2 * MS), (4, 3500 * US)])
    _company(batcher, clock, 5 * MS)  # company is expected before the objective is at risk
    _arrivals(batcher, clock, arrival_gap_ns)
    lone = item(1, 1.0, at=clock)
    await submit(batcher, lone)
    assert batcher.pool.busy_count() == (0 if waits else 1)
    assert bool(clock.pending) is waits
    if waits:
        clock.advance(clock.pending[0] - clock())
    await answer(lone)
    assert backend.batches == [1]
    # a batch that waited had a plan, and its answer teaches the margin; one that went at
    # once because waiting did not pay had none
    assert bool(lone.planned_finish_ns) is waits
    stats = batcher.stats
    assert (stats.objective_planned, stats.objective_direct) == ((1, 0) if waits else (0, 1))


class _TimedBackend(FakeBackend):
    """A CPU model whose run takes 2 ms of wall time: computed, or slept (as a thread
    preempted by the event loop or a client on shared cores would spend it)."""

    RUN_NS = 2 * MS

    def __init__(self, *, computes: bool) -> None:
        super().__init__()
        self.computes = computes

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        if self.computes:
            end = time.thread_time_ns() + self.RUN_NS
            while time.thread_time_ns() < end:
                pass
        else:
            time.sleep(self.RUN_NS / 1e9)
        return super().infer(inputs, output_names)


@pytest.mark.parametrize("computes", [True, False])
async def test_waiting_is_judged_by_the_cpu_time_of_a_cpu_model_not_its_wall_time(
    computes: bool,
) -> None:
    """Batches of two requests taking 2 ms each, at one arrival a millisecond, keep an
    instance saturated only if the 2 ms are its own work; time its thread spent preempted is
    not the model's, and waiting to save the model's fixed cost pays nothing then
    (``Batcher._busy_times``)."""
    clock, backend = ManualClock(), _TimedBackend(computes=computes)
    batcher = _objective(clock, backend)
    batcher.seed_batch_times("fake-0", [(2, _TimedBackend.RUN_NS)])
    for value in range(60):  # the seed mostly forgotten
        pair = item(1, float(value)), item(1, float(value))
        for one in pair:  # in one pass: one batch, and two clients to come back
            batcher.submit(one)
        await asyncio.sleep(0)
        await answers(*pair)
        clock.advance(_TimedBackend.RUN_NS)  # a request a millisecond, as below
    assert backend.batches[-1] == 2
    # by wall time both run as the seed said: 2 ms a batch of two
    assert batcher.batch_time("fake-0").predict(2) >= _TimedBackend.RUN_NS
    _company(batcher, clock, 2 * MS)  # before a batch of two (4 ms) would make it late
    _arrivals(batcher, clock, 1 * MS)
    lone = item(1, 1.0, at=clock)
    await submit(batcher, lone)
    assert bool(clock.pending) is computes
    while clock.pending:  # until its company or its objective's due time
        clock.advance(clock.pending[0] - clock())
    await answer(lone)
    assert backend.batches[-1] == 1
    assert bool(lone.planned_finish_ns) is computes


async def test_the_waiting_rules_learn_afresh_when_waiting_pays_again() -> None:
    """While waiting does not pay, batches go at once and the dispatch timing is not fed
    (the loop is spared its bookkeeping); when waiting pays again what it knew is out of
    date, so it starts from nothing: no company expected until some is seen."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = _objective(clock, backend)
    batcher.seed_batch_times("fake-0", [(1, 2 * MS), (4, 3500 * US)])
    _company(batcher, clock, 5 * MS)
    learned = _timing(batcher)
    _arrivals(batcher, clock, 10 * MS)  # light load: waiting does not pay
    first = item(1, 1.0, at=clock)
    await submit(batcher, first)
    await answer(first)
    assert _timing(batcher) is learned
    before = learned.gaps.expected_gap_ns()
    rate = batcher._objective.rate if batcher._objective is not None else None
    assert rate is not None
    for _ in range(3):  # a flood: waiting pays, once the smoothed rate has followed
        rate.samples += 1000
        clock.advance(ArrivalRate.WINDOW_NS)
        rate.per_ns(clock())
    second = item(1, 2.0, at=clock)
    await submit(batcher, second)
    assert learned.gaps.expected_gap_ns() == before  # not fed while batches went at once
    fresh = _timing(batcher)
    assert fresh is not learned
    assert fresh.gaps.expected_gap_ns() == math.inf
    assert batcher.pool.busy_count() == 1  # nobody expected yet: it went at once
    await answer(second)


def test_the_arrival_rate_counts_samples_over_windows_and_smooths_them() -> None:
    rate, window = ArrivalRate(), ArrivalRate.WINDOW_NS
    assert rate.per_ns(0) is None  # opens the first window
    rate.samples += 10
    assert rate.per_ns(window - 1) is None  # not over yet
    assert rate.per_ns(window) == pytest.approx(10 / window)
    assert rate.samples == 0  # the next window counts afresh
    rate.samples += 30  # three times the rate
    expected = 10 / window + (30 / window - 10 / window) * ArrivalRate.WEIGHT
    assert rate.per_ns(2 * window) == pytest.approx(expected)
    assert rate.per_ns(2 * window + 1) == pytest.approx(expected)  # kept within a window


async def test_a_preferred_batch_size_still_goes_at_once() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _objective(clock, backend, extra="dynamic_batching { preferred_batch_size: [2] }")
    batcher.seed_batch_times("fake-0", [(1, 1 * MS)])
    _company(batcher, clock, 1 * MS)
    pair = [item(1, 1.0, at=clock), item(1, 2.0, at=clock)]
    for one in pair:
        batcher.submit(one)
    await asyncio.sleep(0)  # the pass in which both were queued ends: the batcher dispatches
    assert clock.pending == []  # no wake-up: nothing waits
    await answers(*pair)
    assert backend.batches == [2]


async def test_late_requests_are_refused_at_once_with_the_switch_and_served_without() -> None:
    for refuse in (True, False):
        clock, backend = ManualClock(), FakeBackend()
        batcher = _objective(clock, backend, refuse=refuse)
        batcher.seed_batch_times("fake-0", [(1, 1 * MS)])
        first = await hold_first(batcher, backend, at=clock)
        late = item(1, 1.0, at=clock)
        await submit(batcher, late)
        clock.advance(OBJECTIVE)  # the instance stayed busy all that time
        backend.gate.set()
        await answer(first)
        (outcome,) = await outcomes(late)
        if refuse:
            assert isinstance(outcome, Unavailable)
            assert "cannot finish within the model's latency objective of 10000 us" in str(outcome)
        else:
            assert not isinstance(outcome, BaseException)
        fresh = item(1, 2.0, at=clock)
        await submit(batcher, fresh)
        assert (await answer(fresh))["y"][0, 0] == 5.0  # a request that can make it is served


async def test_batches_teach_the_model_and_its_predictions_are_counted() -> None:
    backend = FakeBackend()
    batcher = _objective(ManualClock(), backend)
    seeded = 50 * MS  # a sample; the fake's runs are timed on the wall clock, and on two
    # busy cores one took 2 ms: far enough above them that a stall cannot pass for the seed
    batcher.seed_batch_times("fake-0", [(1, seeded)])
    for value in range(3):
        one = item(2, float(value))
        await submit(batcher, one)
        await answer(one)
        if value == 0:  # predicted from the seed alone
            assert batcher.stats.batch_time_predicted_ns == pytest.approx(2 * seeded, abs=1)
    assert backend.batches == [2, 2, 2]
    assert batcher.stats.batch_time_measured_ns > 0
    # the fake model takes microseconds: the model has learned that it is faster than seeded
    assert batcher.stats.batch_time_predicted_ns < 3 * 2 * seeded
    assert batcher.batch_time("fake-0").weight > 3  # the seed and the three batches


def test_requests_are_counted_against_the_objective() -> None:
    stats = ModelStats(latency_objective_ns=OBJECTIVE)
    stats.record_request(True, OBJECTIVE - 1, 0)
    stats.record_request(True, OBJECTIVE + 1, 0)
    stats.record_request(False, 1, 0)  # failures are not answers within or after it
    assert (stats.objective_met, stats.objective_missed) == (1, 1)
    plain = ModelStats()
    plain.record_request(True, 1, 0)
    assert (plain.objective_met, plain.objective_missed) == (0, 0)


@pytest.mark.parametrize("batching", [True, False])
def test_the_policy_reads_the_objective_and_the_switch(batching: bool) -> None:
    extra = "batchserve { latency_objective_microseconds: 2500 refuse_late_requests: true }"
    policy = BatchPolicy.from_config(fake_config(extra, batching=batching), 64)
    assert (policy.latency_objective_ns, policy.refuse_late) == (2_500_000, True)
    plain = BatchPolicy.from_config(fake_config(batching=batching), 64)
    assert (plain.latency_objective_ns, plain.refuse_late) == (0, False)


async def test_refusing_late_requests_without_an_objective_refuses_nothing() -> None:
    # nothing can be late without an objective: before, a request that had waited at all was
    # refused (its finish was checked against an objective of 0)
    clock, backend = ManualClock(), FakeBackend()
    batcher = make_batcher(
        [backend], clock=clock, extra="batchserve { refuse_late_requests: true }"
    )
    first = await hold_first(batcher, backend, at=clock)
    waiting = item(1, 1.0, at=clock)
    await submit(batcher, waiting)
    clock.advance(1 * MS)  # it waited for the busy instance
    backend.gate.set()
    await answer(first)
    assert (await answer(waiting))["y"][0, 0] == 3.0


IMAGES = f"""
    name: "cnn" max_batch_size: 8
    input [{{ name: "x" data_type: TYPE_FP32 dims: [-1, -1] }}]
    output [{{ name: "y" data_type: TYPE_FP32 dims: [-1, -1] }}]
    dynamic_batching {{ max_queue_delay_microseconds: 100000 }}
    batchserve {{ latency_objective_microseconds: {OBJECTIVE // US} refuse_late_requests: true }}
"""
PER_PIXEL_NS = 1_000


def _images(clock: ManualClock, backend: FakeBackend) -> Batcher:
    """A model with free height and width whose batches take 1 µs a pixel, whatever the
    rows: for it the batch-time model counts pixels (``batch_time.py``)."""
    batcher = batcher_for([backend], parse_pbtxt(IMAGES), clock)
    batcher.seed_batch_times("fake-0", [(n, n * PER_PIXEL_NS) for n in (64, 4096)])
    return batcher


def _image(side: int, clock: ManualClock) -> WorkItem:
    return request({"x": np.ones((1, side, side), np.float32)}, at=clock, outputs=("y",))


async def test_an_image_s_batch_is_due_by_its_pixels_not_its_rows() -> None:
    """Both are a row, with company expected every 5 ms: a small image (64 pixels) waits for
    it as long as the objective allows; a large one (4,096 pixels, predicted 64 times
    longer) could not be joined in time and goes at once."""
    clock = ManualClock()
    batcher = _images(clock, FakeBackend())
    _company(batcher, clock, 5 * MS)
    small = _image(8, clock)
    await submit(batcher, small)
    allowed = int(OBJECTIVE * (1 - OBJECTIVE_MARGIN))
    predicted = 2 * 64 * PER_PIXEL_NS  # were one more image like it to join
    assert clock.pending == [pytest.approx(small.enqueued_ns + allowed - predicted, abs=2)]
    clock.advance(clock.pending[0] - clock())
    await answer(small)
    large = _image(64, clock)
    await submit(batcher, large)
    assert clock.pending == []
    await answer(large)
    assert large.dispatched_ns == large.enqueued_ns


async def test_an_image_too_large_to_finish_within_the_objective_is_refused_at_once() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _images(clock, backend)
    small, large = _image(8, clock), _image(110, clock)  # 12,100 pixels: 12.1 ms alone
    await submit(batcher, large, small)
    clock.advance(clock.pending[0] - clock() if clock.pending else 0)
    refused, served = await outcomes(large, small)
    assert isinstance(refused, Unavailable)
    assert not isinstance(served, BaseException)
    assert [shape[1:] for shape in backend.shapes] == [(8, 8)]


@pytest.mark.parametrize(("side", "waits"), [(8, False), (64, True)])
async def test_whether_waiting_pays_counts_an_image_s_pixels(side: int, waits: bool) -> None:
    """At one image every 4 ms, small images keep the instance busy 2 % of the time (go at
    once), large ones over all of it (wait for company)."""
    clock = ManualClock()
    batcher = _images(clock, FakeBackend())
    _company(batcher, clock, MS // 2)
    _arrivals(batcher, clock, 4 * MS)
    lone = _image(side, clock)
    await submit(batcher, lone)
    assert batcher.pool.busy_count() == (0 if waits else 1)
    if waits:
        clock.advance(clock.pending[0] - clock())
    await answer(lone)


async def test_a_batch_of_images_is_learned_by_its_pixels() -> None:
    clock, backend = ManualClock(), FakeBackend()
    batcher = _images(clock, backend)
    model = batcher.batch_time("fake-0")
    before = model.sum_x
    images = [_image(8, clock) for _ in range(3)]
    for one in images:
        batcher.submit(one)
    await asyncio.sleep(0)
    if clock.pending:
        clock.advance(clock.pending[0] - clock())
    await answers(*images)
    assert backend.shapes == [(3, 8, 8)]
    assert model.sum_x == pytest.approx(before * FORGET + 3 * 64)


SEQUENCES = f"""
    name: "seq" max_batch_size: 8
    input [{{ name: "x" data_type: TYPE_FP32 dims: [-1] }},
           {{ name: "lengths" data_type: TYPE_INT64 dims: [1] }}]
    output [{{ name: "y" data_type: TYPE_FP32 dims: [-1] }},
            {{ name: "total" data_type: TYPE_FP32 dims: [1] }}]
    dynamic_batching {{ max_queue_delay_microseconds: 100000 }}
    batchserve {{
        sequence_length_input: "lengths"
        latency_objective_microseconds: {OBJECTIVE // US}
    }}
"""


async def test_a_sequence_batch_is_due_by_its_head_s_steps_not_the_longest_queued() -> None:
    """Under steady load the queue never empties and its longest only grows: predicted by
    it, every batch would be planned as the longest ever queued."""
    clock = ManualClock()
    batcher = batcher_for([FakeBackend()], parse_pbtxt(SEQUENCES), clock)
    batcher.seed_batch_times("fake-0", [(n, n * PER_PIXEL_NS) for n in (64, 4096)])  # 1 µs a step
    _company(batcher, clock, 5 * MS)
    lengths = np.array([[10]], np.int64)
    head = request({"x": np.ones((1, 10), np.float32), "lengths": lengths}, at=clock)
    await submit(batcher, head)
    clock.advance(1 * MS)  # company as expected: the objective, not the delay, is due first
    lengths = np.array([[3000]], np.int64)
    long = request({"x": np.ones((1, 3000), np.float32), "lengths": lengths}, at=clock)
    await submit(batcher, long)
    allowed = int(OBJECTIVE * (1 - OBJECTIVE_MARGIN))
    predicted = 3 * 10 * PER_PIXEL_NS  # three rows, were one more to join, of the head's steps
    assert clock.pending == [pytest.approx(head.enqueued_ns + allowed - predicted, abs=2)]
    clock.advance(clock.pending[0] - clock())
    await answers(head, long)
