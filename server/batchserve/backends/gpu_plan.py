"""The batch sizes the GPU paths specialise for: CUDA graphs and TensorRT optimisation profiles.

A CUDA graph replays one fixed shape, and a TensorRT profile is fastest at its ``opt`` shape,
so both are planned around the batch sizes the dynamic batcher aims for (its
``preferred_batch_size`` list). Pure functions of the config, tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchserve.core.errors import ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class BatchRange:
    """The batch sizes one optimisation profile accepts, and the one it is tuned for."""

    low: int
    opt: int
    high: int

    def covers(self, batch: int) -> bool:
        return self.low <= batch <= self.high


def preferred_sizes(config: ModelConfig) -> tuple[int, ...]:
    """``dynamic_batching.preferred_batch_size``, sorted, without repeats or sizes over the max."""
    cap = config.max_batch_size
    sizes = config.dynamic_batching.preferred_batch_size
    return tuple(sorted({s for s in sizes if 1 <= s <= cap}))


def graph_batch_sizes(config: ModelConfig, model_file: Path) -> tuple[int, ...]:
    """Batch sizes to capture CUDA graphs for, smallest first; () when graphs are off.

    Triton's ``optimization.cuda.graph_spec`` batch sizes when given, else the preferred batch
    sizes, else ``max_batch_size``. A batch is padded up to the next captured size, so a batch
    larger than the largest runs without a graph.
    """
    cuda = config.optimization.cuda
    if not cuda.graphs or config.max_batch_size <= 0:
        return ()
    if not cuda.graph_spec:
        return preferred_sizes(config) or (config.max_batch_size,)
    sizes: set[int] = set()
    for spec in cuda.graph_spec:
        if spec.input or spec.HasField("graph_lower_bound"):
            raise ModelConfigError(
                f"{model_file}: optimization.cuda.graph_spec with input shapes or a "
                "graph_lower_bound is not supported; give batch_size only (graphs are captured "
                "for models whose inputs are fixed apart from the batch axis)"
            )
        if not 1 <= spec.batch_size <= config.max_batch_size:
            raise ModelConfigError(
                f"{model_file}: optimization.cuda.graph_spec batch_size {spec.batch_size} is not "
                f"within 1..max_batch_size ({config.max_batch_size})"
            )
        sizes.add(spec.batch_size)
    return tuple(sorted(sizes))


def padded_batch(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds ``batch`` rows, or None when none does."""
    return next((size for size in sorted(sizes) if size >= batch), None)


def plan_profiles(preferred: Iterable[int], max_batch: int) -> tuple[BatchRange, ...]:
    """Optimisation profiles splitting 1..max_batch, each tuned for one preferred size.

    Profile ``i`` takes the batches above the previous preferred size up to its own, so the
    batch sizes the batcher aims for run on a profile tuned for exactly them; a last profile
    tuned for ``max_batch`` takes the rest. No preferred sizes: one profile 1..max_batch.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, not {max_batch}")
    sizes = sorted({size for size in preferred})
    outside = [size for size in sizes if not 1 <= size <= max_batch]
    if outside:
        raise ValueError(f"batch sizes {outside} are not within 1..{max_batch}")
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    lows = [1, *(size + 1 for size in sizes[:-1])]
    return tuple(BatchRange(low, size, size) for low, size in zip(lows, sizes, strict=True))


def best_profile(batch: int, candidates: Sequence[tuple[int, int]]) -> int | None:
    """Of ``(profile, opt batch)`` pairs whose ranges accept ``batch``, the one tuned nearest.

    A profile tuned for at least ``batch`` rows is preferred (its kernels were chosen for a
    batch this size or a little larger); among those, the smallest such ``opt``.
    """
    if not candidates:
        return None
    profile, _ = min(candidates, key=lambda item: (item[1] < batch, abs(item[1] - batch), item[0]))
    return profile
