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
from typing import TypeVar

from batchserve.backends.base import Backend
from batchserve.scheduler.instance_thread import InstanceThread
from batchserve.scheduler.memory import Reservation

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
    """

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self._free: deque[Instance] = deque(instances)
        self._leaving: dict[Instance, asyncio.Future[None]] = {}

    def has_free(self) -> bool:
        return bool(self._free)

    def free(self) -> tuple[Instance, ...]:
        """The instances free now, in the order ``acquire`` hands them out."""
        return tuple(self._free)

    def busy_count(self) -> int:
        return len(self.instances) - len(self._free)

    def acquire(self) -> Instance:
        return self._free.popleft()

    def take(self, instance: Instance) -> Instance:
        """Hand out ``instance``, which must be free (a choice by device: ``routing.py``)."""
        self._free.remove(instance)
        return instance

    def release(self, instance: Instance) -> None:
        leaving = self._leaving.pop(instance, None)
        if leaving is None:
            self._free.append(instance)
        elif not leaving.done():
            leaving.set_result(None)

    def add(self, instance: Instance) -> None:
        """Hand ``instance`` batches from now on."""
        self.instances.append(instance)
        self._free.append(instance)

    def retire(self, instance: Instance) -> asyncio.Future[None]:
        """Hand ``instance`` no more batches; done once it runs none (it may then close)."""
        self.instances.remove(instance)
        done = asyncio.get_running_loop().create_future()
        if instance in self._free:
            self._free.remove(instance)
            done.set_result(None)
        else:
            self._leaving[instance] = done
        return done

    def close(self) -> None:
        for instance in self.instances:
            instance.close()
