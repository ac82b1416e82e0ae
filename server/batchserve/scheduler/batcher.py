"""The dynamic batcher of one model version.

Requests are queued per priority level. Whenever an instance is free, a batch is formed
from the head of the queue up to the batch cap and dispatched:
- at once when it reaches a preferred size, fills the cap, or no delay is configured
  (greedy: batches grow with load by themselves);
- otherwise when the oldest request has waited ``max_queue_delay``.
Requests whose deadline passed or whose client went away are dropped before they cost
compute. Each batch runs on its instance's thread; outputs are split back per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from batchserve.errors import DeadlineExceeded, Unavailable
from batchserve.scheduler.batching import merge_inputs, split_outputs
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.queue import PriorityQueue
from batchserve.scheduler.work import Arrays, WorkItem
from batchserve.stats import ModelStats

Clock = Callable[[], int]


class Batcher:
    """Queue, batch and dispatch the requests of one model version."""

    def __init__(
        self,
        pool: InstancePool,
        policy: BatchPolicy,
        stats: ModelStats,
        *,
        pad_value: float = 0,
        clock: Clock = time.monotonic_ns,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.stats = stats
        self.queue = PriorityQueue(policy.priority_levels, policy.max_queue_size)
        self._pad_value = pad_value
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def cap(self) -> int:
        """Samples per batch (1 for a model without a batch axis)."""
        return max(1, self.policy.max_batch_size)

    def submit(self, item: WorkItem) -> None:
        """Queue a request (Overloaded when full, Unavailable when closed) and dispatch."""
        if self._closed:
            raise Unavailable("model is being unloaded")
        self.queue.push(item)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.queue and self.pool.has_free():
            batch = self._form_batch()
            if batch is None:
                return
            if batch:
                self._start(batch)

    def _form_batch(self) -> list[WorkItem] | None:
        """Items for the next batch; [] if only dropped items were seen; None to wait."""
        self._drop_dead_heads()
        if not self.queue:
            return []
        if not self._ready_to_dispatch():
            return None
        return self._take()

    def _drop_dead_heads(self) -> None:
        now = self._clock()
        while (head := self.queue.peek()) is not None:
            if head.abandoned():
                self.queue.pop()
            elif head.deadline_ns is not None and head.deadline_ns <= now:
                self.queue.pop().future.set_exception(
                    DeadlineExceeded("request timed out in the queue before it could run")
                )
            else:
                return

    def _ready_to_dispatch(self) -> bool:
        policy = self.policy
        if self._closed or not policy.merge_requests or policy.max_queue_delay_ns == 0:
            return True
        waiting = self.queue.samples_waiting(self.cap)
        if waiting >= self.cap or waiting in policy.preferred_batch_sizes:
            return True
        oldest = self.queue.oldest_enqueued_ns()
        assert oldest is not None
        wake_at = oldest + policy.max_queue_delay_ns
        if self._clock() >= wake_at:
            return True
        self._wake_at(wake_at)
        return False

    def _wake_at(self, deadline_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (deadline_ns - self._clock()) / 1e9)
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _take(self) -> list[WorkItem]:
        batch = [self.queue.pop()]
        if not self.policy.merge_requests:
            return batch
        size = batch[0].batch_size
        while (head := self.queue.peek()) is not None and size + head.batch_size <= self.cap:
            item = self.queue.pop()
            if not item.abandoned():
                batch.append(item)
                size += item.batch_size
        return batch

    def _start(self, batch: list[WorkItem]) -> None:
        instance = self.pool.acquire()
        now = self._clock()
        for item in batch:
            item.dispatched_ns = now
        task = asyncio.get_running_loop().create_task(self._execute(instance, batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _execute(self, instance: Instance, batch: list[WorkItem]) -> None:
        try:
            results, timings = await instance.run(lambda: self._run_batch(instance, batch))
        except BaseException as exc:  # delivered to every waiter, never lost
            for item in batch:
                _fail(item, exc)
        else:
            self.stats.record_batch(sum(item.batch_size for item in batch), *timings)
            for item, outputs in zip(batch, results, strict=True):
                if not item.future.done():
                    item.future.set_result(outputs)
        finally:
            self.pool.release(instance)
            self._dispatch()

    def _run_batch(
        self, instance: Instance, batch: list[WorkItem]
    ) -> tuple[list[Arrays], tuple[int, int, int]]:
        """On the instance thread: merge, infer, split; returns results and their timings."""
        t0 = time.monotonic_ns()
        inputs = merge_inputs([item.inputs for item in batch], self._pad_value)
        names = sorted({name for item in batch for name in item.output_names})
        t1 = time.monotonic_ns()
        outputs = instance.backend.infer(inputs, names)
        t2 = time.monotonic_ns()
        parts = split_outputs(outputs, [item.batch_size for item in batch])
        results = [
            {name: part[name] for name in item.output_names}
            for item, part in zip(batch, parts, strict=True)
        ]
        t3 = time.monotonic_ns()
        return results, (t1 - t0, t2 - t1, t3 - t2)

    async def close(self) -> None:
        """Refuse new work, finish what is queued and running."""
        self._closed = True
        while self.queue or self._running:
            self._dispatch()
            if self._running:
                await asyncio.wait(set(self._running))
            elif self.queue and not self.pool.has_free():
                await asyncio.sleep(0.001)
        if self._timer is not None:
            self._timer.cancel()


def _fail(item: WorkItem, exc: BaseException) -> None:
    if item.future.done():
        return
    if isinstance(exc, Exception):
        item.future.set_exception(exc)
    else:
        item.future.cancel()
