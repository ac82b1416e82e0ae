"""The sample each request carries: the same values for the in-process ceiling and
perf_analyzer (``batchserve.profiling.sample_inputs``), with the realistic values this
repository knows for its models (``common.INPUT_DATA``)."""

from __future__ import annotations

from collections.abc import Mapping

from batchserve.profiling import sample_inputs
from batchserve.profiling.sample_inputs import (
    DEFAULT_AXIS,
    INT_HIGH,
    ModelInputs,
    Sample,
    parse_shape,
)
from batchserve.proto.model_config_pb2 import ModelConfig

from bench.common import INPUT_DATA

__all__ = ["DEFAULT_AXIS", "INT_HIGH", "ModelInputs", "Sample", "parse_shape", "plan"]


def plan(
    model: str, config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], seed: int = 0
) -> ModelInputs:
    """The sample of each input of ``model``; ``shapes`` sets free axes (else 32, noted)."""
    known = INPUT_DATA.get(model, {}).get("data", [{}])[0]
    return sample_inputs.plan(model, config, shapes, seed, known)
