"""When a batch is cheaper to run on the event loop than to hand to its instance's thread.

Handing a batch to a worker thread and taking the result back costs two thread wake-ups
and two GIL hand-overs: measured on the 2-core reference machine, ~40-60 µs of CPU and
~90-120 µs of wall time per round trip through ``run_in_executor`` (bench/NOTES.md), about
a third of that through ``instance_thread.py``'s queue. A small CPU model answers a batch
of one in ~60 µs, so at low concurrency the hand-over costs more than the inference.

Batches whose measured run time at their size is below ``INLINE_BELOW_NS`` therefore run
directly on the event loop. Everything else (unmeasured sizes, slow batches, GPU instances,
whose CUDA streams belong to their thread) runs on the instance's thread as before. A run
time is learned per batch size, so a model that is fast at batch 1 but slow at its cap
runs each the way that suits it; and, for a model with free axes, per size of its rows
(a row's positions, to the next power of two): a CNN with free height and width that ran
4 x 4 images inline also ran a 1024 x 1024 one there, and held the event loop, every other
request and the health checks with it, for 300 ms.
"""

from __future__ import annotations

INLINE_BELOW_NS = 200_000
"""Longest batch (by its measured run time) worth blocking the event loop for."""

_WEIGHT = 0.25


class InlineRuns:
    """Smoothed run time per batch size, and the decision it implies."""

    def __init__(self, threshold_ns: int) -> None:
        """``threshold_ns`` 0 turns inline runs off."""
        self._enabled = threshold_ns > 0
        self._threshold_ns = threshold_ns
        self._run_ns: dict[tuple[int, int], float] = {}

    def record(self, samples: int, run_ns: int, row_positions: int = 0) -> None:
        """One run of ``samples`` samples (rows of ``row_positions`` positions each, 0 for
        a model counted in rows) took ``run_ns`` (merge, infer and split)."""
        if not self._enabled:
            return
        key = (samples, row_positions.bit_length())
        mean = self._run_ns.get(key)
        self._run_ns[key] = run_ns if mean is None else mean + (run_ns - mean) * _WEIGHT

    def inline(self, samples: int, row_positions: int = 0) -> bool:
        """True when a batch of ``samples`` (rows of ``row_positions``) is known to run
        faster than a thread hand-over."""
        mean = self._run_ns.get((samples, row_positions.bit_length()))
        return mean is not None and mean < self._threshold_ns
