"""The dynamic batcher of one model version.

Requests are queued per priority level (with aging). Whenever an instance is free, a batch
is formed from the head of the queue up to the batch cap and dispatched:
- at once when no delay is configured (greedy: batches grow with load by themselves), as
  the largest preferred size the queue reaches where it reaches one (Triton's rule);
- otherwise (Triton's rules) when the queue reaches a preferred size (the largest one it
  reaches), when the batch cannot grow without passing the cap or the largest preferred
  size, or when ``dispatch_timing.DispatchTiming`` says it has waited long enough for
  company (at the latest once the oldest request has waited ``max_queue_delay``).
With a latency objective (``batchserve { latency_objective_microseconds }``) a batch that
could still grow waits for company only while its oldest request can still finish within
the objective, given the predicted time of the batch it would join (``batch_time.py``, per
instance, by the batch's samples or, for a model with free axes, its positions) and what
such plans recently overran by (``objective_plan.py``): at the latest
until then, or the queue delay if that comes first. A request that can no longer meet the
objective is served late or, with ``refuse_late_requests``, refused at once.
A submit does not dispatch at once but at the end of the event loop's current pass, so
that the requests decoded in one pass share a batch.
Requests whose deadline passed or whose client went away are dropped before they cost
compute, and a running batch whose clients all went away is stopped where the runtime can
stop it (``run_watch.py``). Each batch runs on its instance's thread (``execution.BatchRun``,
which also recovers from running out of memory and isolates poisoned requests), or directly
on the event loop when ``inline_below_ns`` is set and a CPU batch of its size is measured to run
faster than that (``inline.py``: about what the hand-over to the thread costs). Running
out of memory lowers the cap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from batchserve.core.errors import DeadlineExceeded, Unavailable
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.batch_time import BatchTimeModel
from batchserve.scheduler.dispatch_timing import DispatchTiming
from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.forming import BatchForming, split_evenly
from batchserve.scheduler.inline import InlineRuns
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.length_buckets import StepCost
from batchserve.scheduler.memory import Reservation
from batchserve.scheduler.objective_plan import ObjectivePlan
from batchserve.scheduler.ordering import InOrder
from batchserve.scheduler.padding import SequenceLayout, row_positions
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.queue import PriorityQueue
from batchserve.scheduler.response_cache import ResponseCache, request_key
from batchserve.scheduler.routing import DeviceRouting
from batchserve.scheduler.run_watch import RunWatch
from batchserve.scheduler.timing import Clock, LoopTimer, Timer, WakeUp
from batchserve.scheduler.work import Arrays, Outcome, WorkItem

logger = logging.getLogger(__name__)

SPLIT_WORTH = 0.75
"""A batch is split across free CPU instances only where each part is measured to take at
most this share of the whole's time: a quarter saved, or the parts' extra runs cost more
than they save."""
UNBOUNDED_WORK = 1 << 40
"""The most work of a batch of a model with free axes whose memory does not bound its
positions: more positions than any batch holds (a crossover past it sends all to the CPU)."""
QUEUE_TIMEOUT = (
    "Request timeout expired (batchserve: the request timed out in the queue before it could run)"
)
"""Triton's words first (its dynamic batcher's), which its queue-policy tests read."""


class Batcher:
    """Queue, batch and dispatch the requests of one model version.

    ``clock`` and ``timer`` are injectable (tests advance time by hand); every time the
    batcher sees (``WorkItem.enqueued_ns``, ``deadline_ns``) is on ``clock``.
    """

    def __init__(
        self,
        pool: InstancePool,
        policy: BatchPolicy,
        stats: ModelStats,
        *,
        pad_value: float = 0,
        clock: Clock = time.monotonic_ns,
        timer: Timer | None = None,
        inline_below_ns: int = 0,
    ) -> None:
        self.pool = pool
        pool.on_ready = self._dispatch_soon  # an instance given its resources (rate limiter)
        self.policy = policy
        self.stats = stats
        self.queue = PriorityQueue(
            policy.max_queue_size,
            policy.aging_ns,
            {level: own.max_size for level, own in policy.level_policies},
        )
        self._pad_value = pad_value
        self._clock = clock
        self._timer = timer if timer is not None else LoopTimer(clock)
        self._wakeup = WakeUp(self._timer, self._dispatch)
        self._expiry = WakeUp(self._timer, self._expire_due)
        """At the earliest deadline queued: its request is answered then, not when an
        instance is next free to look at the queue."""
        self.cache: ResponseCache | None = None
        """Triton's response cache, for a model whose config enables it (set by the
        registry); its keys hash the request's inputs on the event loop."""
        self.cache_model = b""
        """The model, version and load the cache keys name."""
        self._watch = RunWatch()
        delay_ns = policy.max_queue_delay_ns if policy.merge_requests else 0
        objective_ns = policy.latency_objective_ns
        self._objective = ObjectivePlan(objective_ns, stats) if objective_ns else None
        waits = delay_ns or (self._objective is not None and policy.merge_requests)
        self._timing = DispatchTiming(delay_ns, policy.wait_out_queue_delay) if waits else None
        """None: nothing waits (no delay, or closed), every free instance takes a batch."""
        self._timing_learns = True
        """Whether the waiting rules are in force and learn from the traffic: always without
        an objective; with one, only while waiting pays (otherwise batches go at once and
        the loop is spared their bookkeeping; they learn afresh when waiting pays again)."""
        self._layout = SequenceLayout(policy.sequence_inputs, policy.sequence_outputs)
        self._grouping = bool(self._layout) and policy.merge_requests
        self._bucketed = self._grouping and policy.length_buckets
        self._step_cost = StepCost(policy.step_cost_rows, self._default_step_cost(pool, policy))
        self._forming = BatchForming(
            self.queue,
            self._settle,
            merge=policy.merge_requests,
            grouping=self._grouping,
            bucketed=self._bucketed,
            step_cost=self._step_cost,
            ragged=policy.batch_io.ragged if policy.batch_io is not None else frozenset(),
        )
        self._forming.set_most_steps(policy.max_batch_steps)
        self._order = InOrder() if policy.preserve_ordering else None
        self._running: set[asyncio.Task[None]] = set()
        self._dispatch_pending = False
        self._inline = InlineRuns(inline_below_ns)
        self._closed = False
        self._urgent = 0
        """Urgent items queued: while there are any, batches go without waiting."""
        self._held_until = policy.hold_first_batch
        """Requests to be queued before the first batch forms (testing hook; 0: none)."""
        self._batch_times = {instance.name: BatchTimeModel() for instance in pool.instances}
        self._busy_times = {instance.name: BatchTimeModel() for instance in pool.instances}
        """With an objective: how long a batch keeps its instance's share of the machine, by
        which waiting is judged to pay. On a CPU device the CPU time of the thread that ran
        it: its wall time also counts what preempted that thread (the event loop, a client
        on shared cores), which read as model work made batches wait where the model's own
        work would never fill the instance (``bench/NOTES.md``). Elsewhere the wall time, the
        device's. The wall-time model (``_batch_times``) still predicts when a batch ends."""
        self.routing = DeviceRouting()
        """With CPU and GPU instances: which device a batch goes to (``routing.py``)."""
        self._set_cap(max(1, policy.max_batch_size))
        self.routing.learn(pool, self._batch_times, self._most_work())

    @staticmethod
    def _default_step_cost(pool: InstancePool, policy: BatchPolicy) -> float:
        """Until learned: a CPU step grows with its rows, a GPU step hardly does."""
        on_cpu = all(i.backend.device.kind == "cpu" for i in pool.instances)
        return 1.0 if on_cpu else float(max(1, policy.max_batch_size))

    def seed_batch_times(self, instance: str, runs: list[tuple[int, int]]) -> None:
        """Start ``instance``'s batch-time model from (work, ns) runs measured at load: work
        in samples, or in positions for a model with free axes (``batch_time.py``)."""
        model = self._batch_times.setdefault(instance, BatchTimeModel())
        busy = self._busy_times.setdefault(instance, BatchTimeModel())
        for work, ns in runs:  # timed at load, with the machine to themselves
            model.record(work, ns)
            busy.record(work, ns)
        self.routing.learn(self.pool, self._batch_times, self._most_work())

    def batch_time(self, instance: str) -> BatchTimeModel:
        """The batch-time model of one instance (statistics, tests)."""
        return self._batch_times.setdefault(instance, BatchTimeModel())

    def add_instance(self, instance: Instance, runs: list[tuple[int, int]]) -> None:
        """Hand ``instance`` batches from now on (instances changed on a live model); the
        (work, ns) ``runs`` measured at its load start its batch-time model."""
        self.pool.add(instance)
        self.seed_batch_times(instance.name, runs)  # after joining: the crossover counts it
        self._dispatch()  # queued requests may go to it at once

    async def remove_instance(self, instance: Instance) -> None:
        """Hand ``instance`` no more batches; return once the batch it runs has finished."""
        await self.pool.retire(instance)
        self._batch_times.pop(instance.name, None)
        self._busy_times.pop(instance.name, None)
        self.routing.learn(self.pool, self._batch_times, self._most_work())

    def set_max_batch_size(self, size: int, steps: int = 0) -> None:
        """The memory budget's caps once instances joined or left: rows, and for a sequence
        model steps; a cap lowered after running out of memory stays as low."""
        lowered = self._cap < self.policy.max_batch_size
        self.policy = replace(self.policy, max_batch_size=size, max_batch_steps=steps)
        self._forming.set_most_steps(steps)
        self._set_cap(min(size, self._cap) if lowered else size)

    @property
    def counts_positions(self) -> bool:
        """Whether batch times (and the CPU/GPU crossover) are in positions, not samples."""
        return bool(self.policy.position_inputs)

    @staticmethod
    def _work(samples: int, row_positions: int) -> int:
        """What a batch's time is learned by: its samples, or with rows of ``row_positions``
        (a model with free axes; 0 otherwise) its positions, the rows padded to them."""
        return samples * row_positions if row_positions else samples

    def _most_work(self) -> int:
        """The work of the largest batch: the cap, or for a model with free axes the
        positions its memory allows."""
        if not self.policy.position_inputs:
            return self._cap
        return self.policy.max_batch_steps or UNBOUNDED_WORK

    def _positions_ahead(self, now: int) -> int:
        """Each row's positions in the batch the queue's head would lead, before it is
        formed (0 for a model counted in rows): the head's own. Only equal shapes batch with
        an image; a sequence's batch is padded to the longest of the lengths cut with it
        (``length_buckets.py``), at least the head's. Not the longest queued: under steady
        load the queue never empties and that only grows, predicting every batch as the
        longest; what such plans overrun by is kept as a margin (``objective_plan.py``)."""
        if not self.policy.position_inputs:
            return 0
        head = self.queue.peek(now)
        return head.row_positions if head is not None else 0

    def _predict_ns(self, work: int, instance: Instance | None = None) -> int:
        """Predicted time of a batch of ``work`` on ``instance``, or on the instance that
        would run it now."""
        if instance is None:
            instances = self.pool.free() or self.pool.instances
            if not instances:
                return 0
            instance = instances[0]
        model = self._batch_times.get(instance.name)
        return model.predict(work) if model is not None else 0

    def lenders(self) -> list[Reservation]:
        """The instances' reservations that may borrow beyond themselves for a request
        admitted alone past them (``padding.check_steps``)."""
        return [i.reservation for i in self.pool.instances if i.reservation is not None]

    @property
    def cap(self) -> int:
        """Samples per batch now: the configured maximum, lowered after running out of memory."""
        return self._cap

    def pending_requests(self) -> int:
        """Requests accepted and not yet running (Triton's
        ``nv_inference_pending_request_count``): those in the queue, a group counting each
        of its clients."""
        return sum(item.clients for item in self.queue)

    def submit(self, item: WorkItem) -> None:
        """Queue a request (Overloaded when full, Unavailable when closed) and dispatch."""
        if self._closed:
            raise Unavailable("model is being unloaded")
        if self.cache is not None and item.clients == 1 and self._from_cache(self.cache, item):
            return
        if self.queue.full_for(item.priority, item.clients):  # clients gone hold no place
            for gone in self.queue.remove_abandoned():
                self._settle(gone, asyncio.CancelledError())
        self._learn_arrival(item)
        if self.policy.position_inputs:
            item.row_positions = row_positions(self.policy.position_inputs, item.inputs)
        self.queue.push(item)
        if self._timing is not None:  # (only a batch that could wait can be cut short)
            self._forming.queued(item)
        if item.deadline_ns is not None:
            self._expiry.at(item.deadline_ns)
        elif item.delay_at_ns is not None:
            self._expiry.at(item.delay_at_ns)
        self._urgent += item.urgent
        if self._order is not None:
            item.ticket = self._order.ticket()
        self._dispatch_soon()

    def _dispatch_soon(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            asyncio.get_running_loop().call_soon(self._deferred_dispatch)

    def _from_cache(self, cache: ResponseCache, item: WorkItem) -> bool:
        """Answer ``item`` from the cache, timed as Triton times a hit (the lookup); on a
        miss, keep its outputs once answered, the lookup and the insertion its miss time."""
        started = self._clock()
        key = request_key(self.cache_model, item.inputs, item.output_names)
        outputs = cache.lookup(key)
        now = self._clock()
        if outputs is None:
            item.future.add_done_callback(partial(self._to_cache, cache, key, now - started))
            return False
        item.dispatched_ns = now
        self.stats.record_cache(True, now - started)
        item.finish({name: outputs[name] for name in item.output_names})
        return True

    def _to_cache(
        self, cache: ResponseCache, key: bytes, lookup_ns: int, answered: asyncio.Future[Arrays]
    ) -> None:
        started = self._clock()
        if not answered.cancelled() and answered.exception() is None:
            cache.insert(key, answered.result())
        self.stats.record_cache(False, lookup_ns + self._clock() - started)

    def _learn_arrival(self, item: WorkItem) -> None:
        timing = self._timing
        if timing is None:
            return
        if self._objective is not None:  # (its batches can wait only with timing)
            self._objective.rate.samples += item.batch_size
        if self._timing_learns:
            # when it reaches this queue, not when it was received: a sequence's step, held
            # until the step before had run, arrives now
            timing.arrived(
                self._clock(), bool(self.queue), not self._dispatch_pending, item.clients
            )

    def _expire_due(self) -> None:
        """Refuse the requests past their queue timeouts, and delay those whose level
        delays them (``timeout_action: DELAY``); either may make a batch ready that was
        not (Triton's test_priority_with_policy: a refused request had kept the others off
        a preferred size), so dispatch looks again."""
        now, queue = self._clock(), self.queue
        expired = queue.remove_expired(now)
        for late in expired:
            self._settle(late, DeadlineExceeded(QUEUE_TIMEOUT))
        if (due := queue.earliest_deadline_ns()) is not None:
            self._expiry.at(due)
        delayed = self.policy.delays_any and queue.delay_expired(now)
        if delayed:
            self._forming.reordered()
        if self.policy.delays_any and (due := queue.earliest_delay_ns()) is not None:
            self._expiry.at(due)
        if expired or delayed:
            self._dispatch_soon()

    def _deferred_dispatch(self) -> None:
        """Dispatch once per event-loop pass, after every request that pass decoded has
        been queued: dispatching on each submit would start a batch with the first of them
        (at once, when it runs inline) and leave the rest for the next batch."""
        self._dispatch_pending = False
        self._dispatch()

    def _set_cap(self, cap: int) -> None:
        self._cap = cap
        self._forming.set_cap(cap, self.policy.preferred_batch_sizes)

    # forming batches ----------------------------------------------------------------
    def _dispatch(self) -> None:
        queue = self.queue
        if self._held_until and self._held():
            return
        # under a rate limiter a free instance first asks for its resources (``stage``)
        while queue and (self.pool.has_free() or self.pool.stage()):
            now = self._clock()
            self._drop_dead_heads(now)
            if not queue:
                break
            target = self._routed_target(now)
            if not target:
                self.pool.withdraw()  # waiting for company holds no resources
                return
            batch = self._forming.take(target, now)
            if self.policy.refuse_late and self._objective is not None:
                samples = sum(item.batch_size for item in batch)
                predicted = self._predict_ns(self._work(samples, self._row_positions(batch)))
                batch = self._objective.refuse_late(batch, now, predicted, self._settle)
            for part in self._spread(batch) if batch else ():
                self._start(part, now)
        if not queue:
            self._emptied()

    def _emptied(self) -> None:
        """The queue ran empty: free the resources held for it, and tell the waiting rules."""
        self.pool.withdraw()
        timing = self._timing
        if timing is not None:
            if self._timing_learns:
                timing.emptied()
            if self._objective is not None:
                self._objective.queue_emptied()

    def _counted_toward_hold(self) -> None:
        """A request was accepted outside the queue (a sequence's step held behind the one
        before): while the first batch is held, it counts, and may end the hold."""
        if self._held_until:
            self._dispatch_soon()

    def _held(self) -> bool:
        """Whether the first batch is still held for the testing hook (``hold_first_batch``);
        asked only while it is."""
        if not self._hold_reached(self._held_until):
            return True
        self._held_until = 0
        return False

    def _hold_reached(self, queued: int) -> bool:
        """Whether enough requests are queued to end the testing hook's hold."""
        return self.pending_requests() >= queued

    def _routed_target(self, now: int) -> int:
        """``_batch_target``, bounded by what the free instances' devices should take."""
        target = self._batch_target(now)
        if target and self.routing.cpu_below:
            head = self.queue.peek(now)
            size, positions = head.batch_size if head else 0, self._positions_ahead(now)
            target = self.routing.limit(self.pool, target, size, positions)
        return target

    def _batch_target(self, now: int) -> int:
        """Samples to dispatch now (0: wait): all that fit, unless the waiting rules apply."""
        timing = self._timing
        if self._urgent:
            return self._cap
        if timing is None:  # no delay: at once, the largest preferred size reached (Triton's)
            forming = self._forming
            return (forming.ready_size() if forming.prefers_sizes else 0) or self._cap
        objective = self._objective
        if objective is not None:
            pays = self._waiting_pays(objective, now)
            if pays and not self._timing_learns:  # what it learned before is out of date
                self._timing = timing = timing.fresh()
            self._timing_learns = pays
            if not pays:
                return self._cap  # as with no queue delay: no plan, no wake-up
        return self._target(timing, now)

    def _drop_dead_heads(self, now: int) -> None:
        while (head := self.queue.peek(now)) is not None:
            if head.abandoned():
                self._settle(self.queue.pop(now), asyncio.CancelledError())
            elif head.deadline_ns is not None and head.deadline_ns <= now:
                self.queue.pop(now)
                self._settle(head, DeadlineExceeded(QUEUE_TIMEOUT))
            else:
                return

    def _target(self, timing: DispatchTiming, now: int) -> int:
        """Samples to dispatch now, or 0 to wait (with a wake-up set)."""
        forming = self._forming
        ready = forming.ready_size() or (self._cap if forming.cut_short(now) else 0)
        oldest = self.queue.oldest_enqueued_ns()
        assert oldest is not None
        if ready:
            timing.went_ready()
            # Triton's rule: once the oldest request has waited the whole delay, the batch
            # takes all it can, up to the cap, past the preferred sizes
            overdue = timing.delay_ns and now - oldest >= timing.delay_ns
            return self._cap if overdue else ready
        due = timing.wait_until(now, oldest, len(self.queue), self._objective_due(oldest, now))
        if due is None:
            return self._cap
        self._wakeup.at(due)
        return 0

    def _waiting_pays(self, objective: ObjectivePlan, now_ns: int) -> bool:
        """Whether the batch being formed may wait for company: only near saturation
        (``objective_plan.py``)."""
        instances = self.pool.instances
        if not instances:
            return True
        queued = self.queue.samples
        busy = self._busy_times.get(instances[0].name)
        work = self._work(queued, self._positions_ahead(now_ns))
        predicted = busy.predict(work) if busy is not None else 0
        return objective.waiting_pays(now_ns, queued, predicted, len(instances))

    def _objective_due(self, oldest_ns: int, now: int) -> int | None:
        """With a latency objective: the latest the batch may go for its oldest request to
        finish within it, were one more request to join; None without an objective."""
        if self._objective is None:
            return None
        samples = min(self._cap, self.queue.samples + 1)
        positions = self._positions_ahead(now)
        return self._objective.due(oldest_ns, self._predict_ns(self._work(samples, positions)))

    def answered(self, item: WorkItem, answered_ns: int, count: int = 1) -> None:
        """``item``'s response was ready at ``answered_ns`` (on the batcher's clock) for
        ``count`` requests (a worker's group)."""
        if self._objective is not None:
            self._objective.answered(item, answered_ns, count)

    def _spread(self, batch: list[WorkItem]) -> list[list[WorkItem]]:
        """The batch, split evenly across the free instances when they are all on the CPU.

        A CPU batch costs about its size in time, so two instances finish two halves in
        half the time one takes for the whole; on a GPU one larger batch is the faster, and
        so on a CPU where the instances' measured batch times say the parts would end no
        sooner (``_parts_sooner``). A
        batch is not split when it or its parts are fast enough to run on the event loop:
        the parts would run there one after another. Nor is a length-bucketed run while
        requests are still queued: the next free instance takes the next run of the cut,
        where the halves would each pay a step's own cost again (on 2 cores, char_lstm at
        c=32 in a simulation: 1.29x padding to the longest rather than 1.20x).
        """
        if len(batch) < 2 or (self._bucketed and self.queue):
            return [batch]
        free = self.pool.free()
        if len(free) < 2 or any(i.backend.device.kind != "cpu" for i in free):
            return [batch]
        samples, positions = sum(item.batch_size for item in batch), self._row_positions(batch)
        part = -(-samples // len(free))
        inline = self._inline.inline
        if inline(samples, positions) or inline(part, positions):
            return [batch]
        if not self._parts_sooner(
            free, self._work(samples, positions), self._work(part, positions)
        ):
            return [batch]
        return split_evenly(batch, len(free))

    def _parts_sooner(self, free: Sequence[Instance], whole: int, part: int) -> bool:
        """Whether each free instance is measured to finish a part in at most
        ``SPLIT_WORTH`` of the whole batch's time (an instance not yet measured is taken to:
        a CPU batch costs about its size). A batch whose time is mostly fixed (a model that
        waits, or a small batch's per-run cost) is not split: its parts would end no sooner,
        each paying the fixed cost again."""
        for instance in free:
            model = self._batch_times.get(instance.name)
            if (
                model is not None
                and model.known
                and (model.predict(part) > SPLIT_WORTH * model.predict(whole))
            ):
                return False
        return True

    # running them -------------------------------------------------------------------
    def _start(self, batch: list[WorkItem], now: int) -> None:
        samples, positions = sum(item.batch_size for item in batch), self._row_positions(batch)
        work = self._work(samples, positions)
        instance = self.routing.acquire(self.pool, work)
        for item in batch:
            item.dispatched_ns = now
            item.executed_batch_size = samples
            self._urgent -= item.urgent
        cpu_clock = self._objective is not None and instance.backend.device.kind == "cpu"
        lender = instance.reservation
        if lender is not None and not lender.batch_steps:
            lender = None  # counted in rows: a batch never holds more than reserved
        run = BatchRun(instance.backend, batch, self._pad_value, self._layout,
                       cpu_clock=cpu_clock, lender=lender,
                       batch_io=self.policy.batch_io)  # fmt: skip
        predicted = 0
        if self._objective is not None:
            predicted = self.batch_time(instance.name).predict(work)
            self._objective.started(batch, now, predicted)
        on_cpu = instance.backend.device.kind == "cpu"
        borrows = lender is not None and lender.extra_bytes(samples * positions) > 0
        if on_cpu and not borrows and self._inline.inline(samples, positions):
            try:
                outcomes: list[Outcome] | BaseException = run()
            except Exception as exc:  # delivered to every waiter, never lost
                outcomes = exc
            self._finish(instance, batch, run, outcomes, predicted)
            return  # the caller's dispatch loop goes on
        self._watch.started(run, batch)
        execute = self._execute(instance, batch, run, predicted)
        task = asyncio.get_running_loop().create_task(execute)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _execute(
        self, instance: Instance, batch: list[WorkItem], run: BatchRun, predicted_ns: int
    ) -> None:
        try:
            outcomes: list[Outcome] | BaseException = await instance.run(run)
        except BaseException as exc:  # delivered to every waiter, never lost
            outcomes = exc
        self._finish(instance, batch, run, outcomes, predicted_ns)
        self._dispatch()

    def _finish(
        self,
        instance: Instance,
        batch: list[WorkItem],
        run: BatchRun,
        outcomes: list[Outcome] | BaseException,
        predicted_ns: int = 0,
    ) -> None:
        self.pool.release(instance, more=bool(self.queue))
        self._watch.finished(run)
        if run.interrupted:  # stopped, or run on where the runtime cannot stop it
            self.stats.stopped_batches += run.stopped
            logger.info(
                "batch's clients went away while it ran",
                extra={"instance": instance.name, "requests": len(batch),
                       "stopped": run.stopped},
            )  # fmt: skip
        if isinstance(outcomes, BaseException):
            self._deliver(batch, [outcomes] * len(batch))
            return
        self._deliver(batch, outcomes)  # first, so that no bookkeeping can strand them
        self._learn(batch, run, instance)
        self._record_compute(batch, run, outcomes)
        timed = self._objective is not None or self.routing.mixed
        # several instances: whether a batch is split across them reads the times too
        if (timed or len(self.pool.instances) > 1) and len(run.executions) == 1:
            e = run.executions[0]  # run whole: the batch's time
            measured = e.input_ns + e.infer_ns + e.output_ns
            work = self._work(e.samples, self._row_positions(batch))
            self.batch_time(instance.name).record(work, measured)
            if self._objective is not None:
                busy = self._busy_times.setdefault(instance.name, BatchTimeModel())
                busy.record(work, e.cpu_ns or measured)
            if predicted_ns:
                self.stats.record_batch_time(predicted_ns, measured)
            if timed:
                self.routing.recorded(self.pool, self._batch_times, self._most_work())
        if self._grouping and len(run.executions) == 1:  # run whole, not split after OOM
            e = run.executions[0]
            steps = max(item.row_positions for item in batch)
            whole = e.input_ns + e.infer_ns + e.output_ns  # the instance's run, copies included
            self._step_cost.record(e.samples, steps, whole)

    def _deliver(self, batch: list[WorkItem], outcomes: list[Outcome]) -> None:
        if self._timing is not None and self._timing_learns:
            self._timing.answered(sum(item.clients for item in batch))
        if self._order is None:
            for item, outcome in zip(batch, outcomes, strict=True):
                item.finish(outcome)
        else:
            for item, outcome in zip(batch, outcomes, strict=True):
                self._order.settle(item, outcome)

    def _record_compute(
        self, batch: list[WorkItem], run: BatchRun, outcomes: list[Outcome]
    ) -> None:
        """Triton's compute statistics: each request the run answered adds the run's compute
        (a worker's group counts each member); a failed request adds none."""
        answered = sum(
            item.clients
            for item, outcome in zip(batch, outcomes, strict=True)
            if not isinstance(outcome, BaseException)
        )
        if answered and run.executions:
            e = run.executions
            self.stats.record_compute(
                answered,
                sum(x.input_ns for x in e),
                sum(x.infer_ns for x in e),
                sum(x.output_ns for x in e),
            )

    def _learn(self, batch: list[WorkItem], run: BatchRun, instance: Instance) -> None:
        """Record the run's executions; after running out of memory, lower the cap to the
        largest batch that then succeeded (and below the smallest that failed)."""
        positions = self._row_positions(batch)
        for e in run.executions:
            self._inline.record(e.samples, e.input_ns + e.infer_ns + e.output_ns, positions)
            self.stats.record_batch(
                e.samples, e.input_ns, e.infer_ns, e.output_ns,
                padding=e.padding, elements=e.elements, cap=self._cap,
            )  # fmt: skip
        if not run.oom_splits:
            return
        self.stats.oom_splits += run.oom_splits
        learned = min(run.smallest_oom - 1, run.largest_ok or run.smallest_oom)
        if learned < self._cap:
            logger.warning(
                "batch cap lowered after running out of memory",
                extra={"instance": instance.name, "cap": max(1, learned), "was": self._cap},
            )
            self._set_cap(max(1, learned))

    def _settle(self, item: WorkItem, outcome: Outcome) -> None:
        self._urgent -= item.urgent
        if self._order is None:
            item.finish(outcome)
        else:
            self._order.settle(item, outcome)

    def _row_positions(self, batch: list[WorkItem]) -> int:
        """The positions of the batch's largest row (0 for a model without free axes): what
        its run time is learned by, with its size (``inline.py``)."""
        if not self.policy.position_inputs:
            return 0
        return max(item.row_positions for item in batch)

    async def close(self) -> None:
        """Refuse new work, finish what is queued and running.

        Once closed, every free instance takes a batch at once and each finished batch
        starts the next, so waiting on the running batches drains the queue.
        """
        self._closed = True
        self._timing = None
        self._dispatch()
        while self._running:
            await asyncio.wait(set(self._running))
        self._wakeup.cancel()
        self._expiry.cancel()
        while self.queue:  # no instance at all to run them: answer rather than strand them
            self._settle(self.queue.pop(self._clock()), Unavailable("model was unloaded"))
