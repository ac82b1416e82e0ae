"""How long a batch takes on one instance: ``fixed + per_unit * work``, learned online.

The work of a batch is its samples for a model counted in rows, and its positions (rows
times a row's positions, padded: a sequence model's steps, an image's pixels) for a model
with free axes, whose batches of one size differ by orders of magnitude in time: a batch
of one 1024 x 1024 image costs what thousands of 16 x 16 ones do.

The objective-driven dispatch (``batcher.py``) needs the time of the batch a waiting request
would join before it runs. A line fits both ends of the field: on a CPU the per-unit term
dominates, on a GPU the fixed one (a batch of 32 costs little more than one). It is seeded at
load from the memory probe's batches (sizes 1, a quarter of the cap and the cap, timed while
their memory was measured) and then follows the instance's own executions, the older ones
forgotten geometrically so that a machine that slows down (other work on its cores) is
followed within tens of batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FORGET = 0.95
"""Weight kept by the past at each new execution: about the last 20 batches count."""


@dataclass(slots=True)
class BatchTimeModel:
    """Weighted least squares of batch time (ns) on work, with exponential forgetting."""

    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0
    _line: tuple[float, float] | None = field(default=None, compare=False, repr=False)
    """``line()`` since the last record: the dispatch asks for predictions on every pass."""

    def record(self, work: int, ns: int) -> None:
        """One execution of ``work`` (samples or positions) that took ``ns`` (input, infer
        and output)."""
        self._line = None
        self.weight = self.weight * FORGET + 1.0
        self.sum_x = self.sum_x * FORGET + work
        self.sum_y = self.sum_y * FORGET + ns
        self.sum_xx = self.sum_xx * FORGET + work * work
        self.sum_xy = self.sum_xy * FORGET + work * ns

    @property
    def known(self) -> bool:
        """Whether anything was recorded: without it no prediction is made."""
        return self.weight > 0

    def line(self) -> tuple[float, float]:
        """(fixed ns, ns per unit of work), both at least 0. With one batch size seen so far
        the time is taken as proportional to the work: the cautious reading on a CPU, where
        a larger batch does cost more."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float]:
        if not self.known:
            return 0.0, 0.0
        mean_x, mean_y = self.sum_x / self.weight, self.sum_y / self.weight
        spread = self.sum_xx / self.weight - mean_x * mean_x
        if spread <= 1e-9 * max(1.0, mean_x * mean_x):
            return 0.0, mean_y / max(mean_x, 1.0)
        slope = (self.sum_xy / self.weight - mean_x * mean_y) / spread
        if slope <= 0:  # larger batches measured no slower: all fixed cost
            return mean_y, 0.0
        fixed = mean_y - slope * mean_x
        if fixed < 0:  # through the origin instead
            return 0.0, self.sum_xy / self.sum_xx
        return fixed, slope

    def predict(self, work: int) -> int:
        """Predicted ns for a batch of ``work``; 0 while nothing is known."""
        fixed, per_unit = self.line()
        return int(fixed + per_unit * work)


def crossover(cpu: BatchTimeModel, gpu: BatchTimeModel, most: int) -> int:
    """The smallest batch work, from 1 to ``most``, that the GPU is predicted to run no
    slower than the CPU (its transfers included: the times are whole runs); ``most + 1``
    when the CPU is faster at every size, and 0 while either has not been measured.

    Solved from the two lines rather than by trying each size: a model counted in positions
    has millions of sizes."""
    if not (cpu.known and gpu.known):
        return 0
    cpu_fixed, cpu_per_unit = cpu.line()
    gpu_fixed, gpu_per_unit = gpu.line()
    if gpu_fixed + gpu_per_unit <= cpu_fixed + cpu_per_unit:
        return 1
    if gpu_per_unit >= cpu_per_unit:  # slower at 1 and growing no slower: never faster
        return most + 1
    equal_at = (gpu_fixed - cpu_fixed) / (cpu_per_unit - gpu_per_unit)
    return min(max(1, math.ceil(equal_at)), most + 1)
