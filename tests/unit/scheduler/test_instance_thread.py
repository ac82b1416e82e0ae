"""The instance thread: jobs run one at a time on one thread, in order; results and errors
reach the awaiting task; a job cancelled before it starts does not run; a stopped thread
takes no job; one never stopped neither leaks its thread nor holds the interpreter at exit."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
import weakref

import pytest
from batchserve.scheduler.instance_thread import InstanceThread

pytestmark = pytest.mark.anyio


async def test_jobs_run_in_order_on_one_thread_that_is_not_the_loop_s() -> None:
    worker = InstanceThread("ordered")
    try:
        seen: list[tuple[int, int]] = []

        def job(n: int) -> int:
            seen.append((n, threading.get_ident()))
            return n * n

        results = await asyncio.gather(*(worker.run(lambda n=n: job(n)) for n in range(20)))
        assert results == [n * n for n in range(20)]
        assert [n for n, _ in seen] == list(range(20))
        threads = {ident for _, ident in seen}
        assert len(threads) == 1
        assert threads != {threading.get_ident()}
    finally:
        worker.stop()


async def test_an_error_reaches_the_awaiting_task_and_the_thread_goes_on() -> None:
    worker = InstanceThread("errors")
    try:

        def fail() -> None:
            raise ValueError("from the instance")

        with pytest.raises(ValueError, match="from the instance"):
            await worker.run(fail)
        assert await worker.run(lambda: 7) == 7
    finally:
        worker.stop()


async def test_a_job_cancelled_before_it_starts_does_not_run() -> None:
    worker = InstanceThread("cancelled")
    gate = threading.Event()
    ran: list[str] = []
    try:
        blocker = worker.run(gate.wait)
        queued = worker.run(lambda: ran.append("queued"))
        queued.cancel()
        gate.set()
        assert await blocker is True
        assert await worker.run(lambda: "after") == "after"
        assert ran == []
    finally:
        worker.stop()


async def test_a_job_cancelled_while_it_runs_finishes_and_its_result_is_dropped() -> None:
    worker = InstanceThread("running")
    started, gate = threading.Event(), threading.Event()
    done: list[str] = []

    def slow() -> str:
        started.set()
        gate.wait()
        done.append("finished")
        return "late"

    try:
        running = worker.run(slow)
        await asyncio.to_thread(started.wait)
        running.cancel()
        gate.set()
        assert await worker.run(lambda: "next") == "next"  # after slow, in order
        assert done == ["finished"]
        assert running.cancelled()
    finally:
        worker.stop()


class _Held:
    """Something a job captures or returns: a batch's inputs, say."""


async def test_an_idle_thread_holds_nothing_of_the_jobs_it_ran() -> None:
    """An instance thread waiting for its next job kept the last one's function and result:
    a batch's inputs, views into a worker's arena, kept that arena mapped after its worker
    died for as long as the instance stayed idle."""
    worker = InstanceThread("idle")
    try:
        captured = _Held()
        held = [weakref.ref(captured)]

        def job(kept: _Held = captured) -> tuple[_Held, _Held]:
            made = _Held()
            held.append(weakref.ref(made))
            return kept, made

        result = await worker.run(job)
        assert result[0] is captured
        assert held[1]() is result[1]
        del captured, job, result
        deadline = time.monotonic() + 5
        while any(ref() is not None for ref in held) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the thread drops them just after settling the future
        assert [ref() for ref in held] == [None, None]
    finally:
        worker.stop()


def test_call_waits_for_its_job_and_raises_its_error() -> None:
    worker = InstanceThread("blocking")
    try:
        assert worker.call(lambda: threading.current_thread().name) == "blocking"

        def fail() -> None:
            raise KeyError("unload")

        with pytest.raises(KeyError, match="unload"):
            worker.call(fail)
    finally:
        worker.stop()


async def test_a_stopped_thread_ends_and_refuses_new_jobs() -> None:
    worker = InstanceThread("stopped")
    thread = worker._thread
    assert await worker.run(lambda: 1) == 1
    worker.stop()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="has stopped"):
        worker.run(lambda: 2)
    with pytest.raises(RuntimeError, match="has stopped"):
        worker.call(lambda: 2)


def test_a_result_for_a_closed_loop_does_not_stop_the_thread() -> None:
    worker = InstanceThread("orphaned")
    gate = threading.Event()
    try:

        async def give() -> None:
            worker.run(gate.wait)  # settled after its loop has closed

        other = asyncio.new_event_loop()
        other.run_until_complete(give())
        other.close()
        gate.set()
        assert worker.call(lambda: "still serving") == "still serving"
    finally:
        worker.stop()


def test_a_thread_dropped_without_stop_ends_when_collected() -> None:
    worker = InstanceThread("dropped")
    thread = worker._thread
    assert worker.call(lambda: 3) == 3
    del worker
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_an_unstopped_thread_does_not_hold_the_interpreter_at_exit() -> None:
    program = (
        "import sys, time\n"
        "from batchserve.scheduler.instance_thread import InstanceThread\n"
        "kept = InstanceThread('kept')\n"
        "kept.call(lambda: None)\n"
        "kept.run  # referenced to the end, never stopped\n"
        "def last(): time.sleep(0.2); print('finished', flush=True)\n"
        "import asyncio\n"
        "async def main(): kept.run(last)\n"
        "asyncio.run(main())\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finished\n", "the job it was given still ran to its end"
    assert time.monotonic() - started < 30
