"""A running batch whose clients have all gone away is stopped, where the runtime can stop
it, and its instance takes the next batch at once; a batch anyone still waits for runs on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from batchserve.scheduler import run_watch
from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.padding import SequenceLayout
from fakes import FakeBackend
from harness import answer, answers, entered, item, make_batcher, submit

pytestmark = pytest.mark.anyio

PERIOD_S = 0.01


@pytest.fixture(autouse=True)
def _short_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_watch, "CHECK_EVERY_S", PERIOD_S)


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "waited 5 s"
        await asyncio.sleep(PERIOD_S / 2)


async def test_a_batch_its_client_left_is_stopped_and_the_next_runs_at_once() -> None:
    backend = FakeBackend(stoppable=True)
    batcher = make_batcher([backend])
    backend.gate.clear()  # a long run
    gone = item(1, 1.0)
    await submit(batcher, gone)
    await entered(backend)
    await asyncio.sleep(3 * PERIOD_S)
    assert backend.interrupts == 0, "its client still waits"
    gone.future.cancel()  # its client left
    await _until(lambda: backend.interrupts > 0)
    waiting = item(1, 2.0)
    await submit(batcher, waiting)
    assert (await answer(waiting))["y"][0, 0] == 5.0
    assert backend.batches == [1], "the stopped run answered nothing; the next one ran"
    assert batcher.stats.stopped_batches == 1


async def test_a_batch_someone_still_waits_for_runs_on() -> None:
    backend = FakeBackend(stoppable=True)
    batcher = make_batcher([backend])
    backend.gate.clear()
    gone, staying = item(1, 1.0), item(1, 2.0)
    batcher.submit(gone)
    batcher.submit(staying)  # in one pass: one batch of two
    await entered(backend)
    gone.future.cancel()
    await asyncio.sleep(5 * PERIOD_S)
    assert backend.interrupts == 0
    backend.gate.set()
    assert (await answer(staying))["y"][0, 0] == 5.0
    assert backend.batches == [2]


async def test_a_runtime_that_cannot_stop_runs_on_and_is_asked_again() -> None:
    """torch and TensorRT cannot stop a run: it ends as it would have; the watch asks each
    period, as a stop that came as a run began may have missed it."""
    backend = FakeBackend()
    batcher = make_batcher([backend])
    backend.gate.clear()
    gone = item(1, 1.0)
    await submit(batcher, gone)
    await entered(backend)
    gone.future.cancel()
    await _until(lambda: backend.interrupts >= 2)
    backend.gate.set()
    waiting = item(1, 2.0)
    await submit(batcher, waiting)
    await answers(waiting)
    assert backend.batches == [1, 1]
    assert batcher.stats.stopped_batches == 0, "it ran whole"


async def test_the_watch_stops_looking_once_nothing_runs() -> None:
    backend = FakeBackend(stoppable=True)
    batcher = make_batcher([backend])
    one = item(1, 1.0)
    await submit(batcher, one)
    await answer(one)
    await asyncio.sleep(3 * PERIOD_S)
    assert not batcher._watch._armed


async def test_a_stopped_run_is_not_retried_in_parts_and_answers_cancelled() -> None:
    """A failure after a stop is the stop's: the batch is not bisected as a poisoned one
    would be, nor split as one out of memory."""
    backend = FakeBackend(stoppable=True, oom_above=1)
    loop = asyncio.get_running_loop()
    batch = [item(1, float(n)) for n in range(4)]
    run = BatchRun(backend, batch, 0, SequenceLayout((), ()))
    run.interrupt()
    outcomes = await loop.run_in_executor(None, run)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
    assert run.stopped
    assert (backend.batches, run.oom_splits, backend.entered.acquire(blocking=False)) == (
        [],
        0,
        False,
    ), "nothing ran once stopped"
    assert backend.interrupts == 1
