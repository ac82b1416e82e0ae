"""Model instances and the worker thread each one runs its batches on.

One thread per instance: a GPU runtime's session and CUDA stream are only ever touched
from that thread, and the event loop does not block on inference. The one exception is a
CPU batch measured to run faster than the hand-over to this thread costs, which the
batcher runs on the loop instead (``inline.py``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from batchserve.backends.base import Backend
from batchserve.scheduler.instance_thread import InstanceThread
from batchserve.scheduler.memory import Reservation
from batchserve.scheduler.rate_limiter import InstanceLimits, RateLimiter

_R = TypeVar("_R")


@dataclass(eq=False)
class Instance:
    """One loaded copy of a model with its own worker thread."""

    name: str
    backend: Backend
    reservation: Reservation | None = None
    """Its memory in the device budget, set once reserved at load: a batch of more
    positions than it holds borrows the rest from the budget for its run
    (``Reservation.borrow``). None for a model with its own ``memory_budget_bytes``, whose
    batches stay within what it reserved."""
    limits: InstanceLimits = field(default_factory=InstanceLimits)
    """What its group's ``rate_limiter`` says it needs to run (``rate_limiter.py``)."""
    thread: InstanceThread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = InstanceThread(self.name)

    async def run(self, fn: Callable[[], _R]) -> _R:
        """Run ``fn`` on this instance's thread."""
        return await self.thread.run(fn)

    def close(self) -> None:
        """Release the backend, then stop the thread once its current work is done."""
        try:
            self.thread.call(self.backend.unload)
        finally:
            self.thread.stop()


class InstancePool:
    """Free instances, handed out one batch at a time.

    Instances may join and leave while it serves (an instance change without a reload): one
    that leaves takes no further batch, and its ``retire`` future is done once the batch it
    was running, if any, has finished.

    Under a ``RateLimiter`` a free instance is handed out only once it holds its resources:
    ``stage`` asks for them when a batch is ready, ``on_ready`` is called when they come
    later, and ``withdraw`` gives back what a batch that will not go now was given.
    """

    def __init__(self, instances: list[Instance], limiter: RateLimiter | None = None) -> None:
        self.instances = instances
        self._free: deque[Instance] = deque(instances)
        self._leaving: dict[Instance, asyncio.Future[None]] = {}
        self._limiter = limiter
        self._ready: deque[Instance] = deque()
        """Under a limiter: the free instances that hold their resources."""
        self._staged: set[Instance] = set()
        self.on_ready: Callable[[], None] = _nothing
        """Called when an instance is given its resources after ``stage`` (the batcher
        dispatches then)."""
        for instance in instances:
            self._register(instance)

    def has_free(self) -> bool:
        return bool(self._free if self._limiter is None else self._ready)

    def free(self) -> tuple[Instance, ...]:
        """The instances free now, in the order ``acquire`` hands them out."""
        return tuple(self._free if self._limiter is None else self._ready)

    def busy_count(self) -> int:
        return len(self.instances) - len(self._free)

    def acquire(self) -> Instance:
        if self._limiter is None:
            return self._free.popleft()
        instance = self._ready.popleft()
        self._free.remove(instance)
        return instance

    def take(self, instance: Instance) -> Instance:
        """Hand out ``instance``, which must be free (a choice by device: ``routing.py``)."""
        self._free.remove(instance)
        if self._limiter is not None:
            self._ready.remove(instance)
        return instance

    def stage(self) -> bool:
        """Under a limiter, ask resources for a free instance not yet asking: True when it
        holds them now (``has_free``); False otherwise (``on_ready`` follows if it asked)."""
        limiter = self._limiter
        if limiter is None:
            return False
        for instance in self._free:
            if instance not in self._ready and instance not in self._staged:
                self._staged.add(instance)
                if limiter.request(instance, partial(self._given, instance)):
                    self._given(instance, now=True)
                    return True
                return False
        return False

    def withdraw(self) -> None:
        """What was asked for or given to free instances goes back: no batch goes now."""
        limiter = self._limiter
        if limiter is None:
            return
        for instance in (*self._ready, *self._staged):
            limiter.withdraw(instance)
        self._ready.clear()
        self._staged.clear()

    def _given(self, instance: Instance, now: bool = False) -> None:
        if instance not in self._staged:
            return  # withdrawn, or already counted
        self._staged.discard(instance)
        if instance not in self._free:  # retired meanwhile
            if self._limiter is not None:
                self._limiter.withdraw(instance)
            return
        self._ready.append(instance)
        if not now:
            self.on_ready()

    def release(self, instance: Instance, more: bool = False) -> None:
        """``instance``'s batch has ended; ``more``: its model has another queued, for which
        it asks its resources again at once (under a limiter)."""
        leaving = self._leaving.pop(instance, None)
        if leaving is None:
            self._free.append(instance)
            if self._limiter is not None:
                again = partial(self._given, instance) if more else None
                if more:
                    self._staged.add(instance)
                self._limiter.release(instance, again)
            return
        if self._limiter is not None:
            self._limiter.release(instance)
        self._unregister(instance)
        if not leaving.done():
            leaving.set_result(None)

    def add(self, instance: Instance) -> None:
        """Hand ``instance`` batches from now on."""
        self.instances.append(instance)
        self._free.append(instance)
        self._register(instance)

    def retire(self, instance: Instance) -> asyncio.Future[None]:
        """Hand ``instance`` no more batches; done once it runs none (it may then close)."""
        self.instances.remove(instance)
        done = asyncio.get_running_loop().create_future()
        self._staged.discard(instance)
        if instance in self._ready:
            self._ready.remove(instance)
        if instance in self._free:
            self._free.remove(instance)
            self._unregister(instance)
            done.set_result(None)
        else:  # its batch's resources go back when it ends
            self._leaving[instance] = done
        return done

    def close(self) -> None:
        for instance in self.instances:
            self._unregister(instance)
            instance.close()

    def _register(self, instance: Instance) -> None:
        if self._limiter is not None:
            self._limiter.register(instance, instance.limits)

    def _unregister(self, instance: Instance) -> None:
        if self._limiter is not None:
            self._limiter.unregister(instance)


def _nothing() -> None:
    """``on_ready`` of a pool no batcher serves."""
