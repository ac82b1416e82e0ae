"""Inputs for warming a model up, and for measuring it, before it is declared ready.

Triton warms a model up only when its config has ``model_warmup`` samples; batchserve always
runs a batch at the instance's batch cap (and the memory probe runs several), so it needs
inputs for every model. A config's own samples (``warmup_samples``) are the best inputs a
model can get: they are what its author knows it accepts. Without them, inputs are synthetic.

BYTES elements: Triton's ``zero_data`` for TYPE_STRING is zero-filled memory, each element's
4-byte length prefix 0, so empty strings; ``random_data`` strings are the same zeros (triton
core, ``TritonModelInstance::GenerateWarmupData``). Samples here do the same. The *implicit*
run, which Triton does not make at all, must not fail a model that parses its strings (Triton's
``simple_string`` adds integers held as strings), so its element is ``b"0"``: an integer and a
float to any parser, and text to anything else.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from batchserve.core.datatypes import from_config
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batch_io import model_feed
from batchserve.scheduler.sequences import SequencePolicy

SYNTHETIC_BYTES = b"0"
"""The BYTES element of implicit warm-up and probe batches (see the module docstring)."""

Arrays = Mapping[str, np.ndarray]


def zero_inputs(
    config: ModelConfig, batch_size: int = 1, free_dim: int = 1
) -> dict[str, np.ndarray]:
    """Zeros (``SYNTHETIC_BYTES`` for BYTES) shaped as the config's client-facing ``dims``;
    free dims get ``free_dim``. Optional inputs are left out, as a client may leave them."""
    batch = [batch_size] if config.max_batch_size > 0 else []
    arrays: dict[str, np.ndarray] = {}
    for spec in config.input:
        if spec.optional:
            continue
        shape = tuple(batch + [d if d >= 0 else free_dim for d in spec.dims])
        datatype = from_config(spec.data_type)
        if datatype.wire == "BYTES":
            arrays[spec.name] = np.full(shape, SYNTHETIC_BYTES, dtype=object)
        else:
            arrays[spec.name] = np.zeros(shape, dtype=datatype.numpy)
    sequences = SequencePolicy.from_config(config)
    if sequences is not None:  # what the sequence batcher adds to every step
        arrays.update(sequences.zeros(batch_size))
    return arrays


def repeat_rows(sample: Arrays, batch_size: int) -> dict[str, np.ndarray]:
    """A batch of ``batch_size`` rows, each the first row of a batched ``sample``."""
    return {name: np.repeat(array[:1], batch_size, axis=0) for name, array in sample.items()}


def synthetic_batch(
    config: ModelConfig, batch_size: int, free_dim: int, sample: Arrays | None
) -> dict[str, np.ndarray]:
    """A probe or warm-up batch, as the model takes it (``batch_io.model_feed``): the
    config's first warm-up sample repeated when it has one (and the model batches), else
    ``zero_inputs``."""
    if sample is None:
        batch = zero_inputs(config, batch_size, free_dim)
    elif config.max_batch_size <= 0:
        batch = dict(sample)
    else:
        batch = repeat_rows(sample, batch_size)
    return dict(model_feed(config, batch))
