"""Synthetic inputs for warming a model up before it is declared ready."""

from __future__ import annotations

import numpy as np

from batchserve.datatypes import from_config
from batchserve.grpc.generated.model_config_pb2 import ModelConfig


def zero_inputs(
    config: ModelConfig, batch_size: int = 1, free_dim: int = 1
) -> dict[str, np.ndarray]:
    """Zeros (empty strings for BYTES) shaped as the config says; free dims get ``free_dim``."""
    batch = [batch_size] if config.max_batch_size > 0 else []
    arrays: dict[str, np.ndarray] = {}
    for spec in config.input:
        shape = tuple(batch + [d if d >= 0 else free_dim for d in spec.dims])
        datatype = from_config(spec.data_type)
        if datatype.wire == "BYTES":
            arrays[spec.name] = np.full(shape, b"", dtype=object)
        else:
            arrays[spec.name] = np.zeros(shape, dtype=datatype.numpy)
    return arrays
