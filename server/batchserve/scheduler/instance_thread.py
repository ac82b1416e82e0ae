"""The thread an instance runs its batches on, and the hand-over to it.

``loop.run_in_executor`` builds, for every call, a ``concurrent.futures.Future`` with its
own lock and condition, an executor work item, an asyncio future chained to the first in
both directions, and checks that the function is no coroutine function; measured on the
2-core reference machine, a round trip of a no-op cost 63-96 µs of CPU and 55-84 µs of wall
time. This hand-over is a queue of ``(function, loop, future)``: the thread runs the
function and settles the asyncio future with one ``call_soon_threadsafe``, 21-28 µs of CPU
and wall time for the same round trip. What is left is the two thread wake-ups themselves.

As with an executor of one worker: jobs run one at a time in the order they were given,
a job whose future was cancelled before it started does not run, and the thread is not
a daemon: at interpreter exit it finishes the job it is running, then ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future as BlockingFuture
from typing import Any, TypeVar

_R = TypeVar("_R")
_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop | None, Any]
"""A function, and the loop and asyncio future to settle (or no loop and a blocking future)."""

_live: weakref.WeakSet[InstanceThread] = weakref.WeakSet()


class InstanceThread:
    """One thread, and jobs handed to it from an event loop (``run``) or from any other
    thread (``call``)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stopped = False
        # The thread holds the queue, not this object: one dropped without ``stop`` ends
        # its thread when collected, as an executor's worker does.
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=name)
        self._thread.start()
        weakref.finalize(self, self._jobs.put, None)
        _live.add(self)

    def run(self, fn: Callable[[], _R]) -> asyncio.Future[_R]:
        """``fn()`` on this thread, awaited from the running event loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_R] = loop.create_future()
        self._give((fn, loop, future))
        return future

    def call(self, fn: Callable[[], _R]) -> _R:
        """``fn()`` on this thread, waited for by the calling thread (not this one)."""
        future: BlockingFuture[_R] = BlockingFuture()
        self._give((fn, None, future))
        return future.result()

    def stop(self) -> None:
        """End the thread once the jobs already given have run; wait for it."""
        self._stopped = True
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _give(self, job: _Job) -> None:
        if self._stopped:  # as an executor after shutdown: no job may wait forever
            raise RuntimeError(f"thread {self._thread.name} has stopped")
        self._jobs.put(job)


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    get = jobs.get
    while (job := get()) is not None:
        _run(*job)
        # What a job holds goes with it, not when the next job comes: an instance left idle
        # kept its last batch's inputs, views into a dead worker's arena, which stayed mapped.
        del job


def _run(fn: Callable[[], Any], loop: asyncio.AbstractEventLoop | None, future: Any) -> None:
    if loop is None:
        _run_blocking(fn, future)
        return
    if future.cancelled():  # read across threads: at worst the job runs anyway
        return
    try:
        result = fn()
    except BaseException as exc:  # delivered to the awaiting task, never lost
        _settle_soon(loop, future, None, exc)
    else:
        _settle_soon(loop, future, result, None)


def _run_blocking(fn: Callable[[], Any], future: BlockingFuture[Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)


def _settle_soon(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _stop_all_at_exit() -> None:
    """As ``concurrent.futures`` does for its workers: the interpreter waits for non-daemon
    threads before ``atexit`` handlers run, so an instance never closed would hold it."""
    threads = list(_live)
    for thread in threads:
        thread._jobs.put(None)
    for thread in threads:
        thread._thread.join()


threading._register_atexit(_stop_all_at_exit)  # type: ignore[attr-defined]
