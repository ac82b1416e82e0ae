"""Which instance runs a batch when a model has both CPU and GPU instances.

Moving a small batch to a GPU and back can cost more than computing it on the CPU; a large
one is far faster there. The crossover, the smallest batch the GPU runs no slower (transfers
included), comes from each device's batch-time model (``batch_time.py``: seeded at load from
the memory probe's timed batches, then learned from every batch run), so the split follows
the measurements, not a setting. Batches below it take a free CPU instance (a GPU one when no
CPU instance is free); the others only a GPU instance: while none is free, the CPU instances
take only batches below the crossover from the queue. Like the batch-time models, the
crossover is in samples for a model counted in rows and in positions for a model with free
axes: one large image is worth a GPU where a batch of small ones is not.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchserve.scheduler.batch_time import BatchTimeModel, crossover
from batchserve.scheduler.instances import Instance, InstancePool

RELEARN_EVERY = 16
"""Batches recorded between two computations of the crossover."""


def _on_cpu(instance: Instance) -> bool:
    return instance.backend.device.kind == "cpu"


class DeviceRouting:
    """The crossover of one pool's CPU and GPU instances, and the choices it implies."""

    def __init__(self) -> None:
        self.cpu_below = 0
        """Batches of less work (samples or positions) go to CPU instances; 0: no split
        (one kind of device, or not measured yet)."""
        self.mixed = False
        """The pool has instances on both kinds of device (as of the last ``learn``): its
        batches' times are then recorded, for the crossover."""
        self._recorded = 0

    def learn(self, pool: InstancePool, models: Mapping[str, BatchTimeModel], most: int) -> None:
        """Compute the crossover again from the first CPU and GPU instances' models (call it
        whenever instances join or leave); ``most``: the work of the largest batch."""
        self._recorded = 0
        cpu = next((i for i in pool.instances if _on_cpu(i)), None)
        gpu = next((i for i in pool.instances if not _on_cpu(i)), None)
        self.mixed = cpu is not None and gpu is not None
        if cpu is None or gpu is None or cpu.name not in models or gpu.name not in models:
            self.cpu_below = 0
            return
        found = crossover(models[cpu.name], models[gpu.name], most)
        self.cpu_below = found if found > 1 else 0

    def recorded(self, pool: InstancePool, models: Mapping[str, BatchTimeModel], most: int) -> None:
        """A batch's time was recorded: learn again every ``RELEARN_EVERY`` of them."""
        self._recorded += 1
        if self._recorded >= RELEARN_EVERY:
            self.learn(pool, models, most)

    def limit(self, pool: InstancePool, target: int, head: int, row_positions: int = 0) -> int:
        """``target`` samples, or fewer than make the crossover's work while only CPU
        instances are free; 0 (wait for a GPU instance) when the queue's ``head`` request
        alone is not under it. ``row_positions``: each row's in the batch to come (0 for a
        model counted in rows)."""
        if not self.cpu_below or any(not _on_cpu(i) for i in pool.free()):
            return target
        per_row = max(1, row_positions)
        if head * per_row >= self.cpu_below:
            return 0
        return min(target, (self.cpu_below - 1) // per_row)

    def acquire(self, pool: InstancePool, work: int) -> Instance:
        """The free instance a batch of ``work`` (samples or positions) runs on."""
        if not self.cpu_below:
            return pool.acquire()
        wanted = work < self.cpu_below
        for instance in pool.free():
            if _on_cpu(instance) == wanted:
                return pool.take(instance)
        return pool.acquire()
