"""How long a batch takes on one instance: ``fixed + per_sample * samples``, learned online.

The objective-driven dispatch (``batcher.py``) needs the time of the batch a waiting request
would join before it runs. A line fits both ends of the field: on a CPU the per-sample term
dominates, on a GPU the fixed one (a batch of 32 costs little more than one). It is seeded at
load from the memory probe's batches (sizes 1, a quarter of the cap and the cap, timed while
their memory was measured) and then follows the instance's own executions, the older ones
forgotten geometrically so that a machine that slows down (other work on its cores) is
followed within tens of batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORGET = 0.95
"""Weight kept by the past at each new execution: about the last 20 batches count."""


@dataclass(slots=True)
class BatchTimeModel:
    """Weighted least squares of batch time (ns) on samples, with exponential forgetting."""

    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0
    _line: tuple[float, float] | None = field(default=None, compare=False, repr=False)
    """``line()`` since the last record: the dispatch asks for predictions on every pass."""

    def record(self, samples: int, ns: int) -> None:
        """One execution of ``samples`` samples that took ``ns`` (input, infer and output)."""
        self._line = None
        self.weight = self.weight * FORGET + 1.0
        self.sum_x = self.sum_x * FORGET + samples
        self.sum_y = self.sum_y * FORGET + ns
        self.sum_xx = self.sum_xx * FORGET + samples * samples
        self.sum_xy = self.sum_xy * FORGET + samples * ns

    @property
    def known(self) -> bool:
        """Whether anything was recorded: without it no prediction is made."""
        return self.weight > 0

    def line(self) -> tuple[float, float]:
        """(fixed ns, ns per sample), both at least 0. With one batch size seen so far the
        time is taken as proportional to the samples: the cautious reading on a CPU, where
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

    def predict(self, samples: int) -> int:
        """Predicted ns for a batch of ``samples``; 0 while nothing is known."""
        fixed, per_sample = self.line()
        return int(fixed + per_sample * samples)


def crossover(cpu: BatchTimeModel, gpu: BatchTimeModel, cap: int) -> int:
    """The smallest batch, from 1 to ``cap``, that the GPU is predicted to run no slower than
    the CPU (its transfers included: the times are whole runs); ``cap + 1`` when the CPU is
    faster at every size, and 0 while either has not been measured."""
    if not (cpu.known and gpu.known):
        return 0
    for samples in range(1, cap + 1):
        if gpu.predict(samples) <= cpu.predict(samples):
            return samples
    return cap + 1
