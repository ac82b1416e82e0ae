"""A config's ``model_warmup`` samples as arrays, read the way Triton reads them.

Triton's semantics (triton core ``TritonModelInstance::GenerateWarmupData``): a sample with
``batch_size`` 0 is skipped; each input's ``dims`` exclude the batch axis and must be fixed;
``zero_data`` is zeros (empty strings for TYPE_STRING), ``random_data`` random bytes (empty
strings for TYPE_STRING); ``input_data_file`` names a file in the model's ``warmup/``
directory holding raw little-endian elements (at least as many bytes as the tensor needs,
the rest ignored) or, for TYPE_STRING, 4-byte-length-prefixed strings. ``count`` 0 means once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from batchserve.core.datatypes import from_config
from batchserve.core.errors import ModelConfigError
from batchserve.models.data_files import inside_folder, tensor_from_file
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelWarmup

WARMUP_DIR: Final = "warmup"
MAX_SAMPLE_ELEMENTS: Final = 1 << 28
"""Largest element count of one sample input, so that a config cannot ask for terabytes."""
MAX_COUNT: Final = 10_000
"""Most runs of one sample. A load runs them all before it returns, holding the model's
lock: ``count: 4000000000`` left every later load or unload of the model waiting."""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One sample: ``inputs`` already hold ``batch_size`` rows when the model batches."""

    name: str
    count: int
    inputs: dict[str, np.ndarray]


def read_warmup_samples(
    config: ModelConfig, model_dir: Path, *, source: str
) -> tuple[WarmupSample, ...]:
    """Every sample with a batch, built; ModelConfigError naming the sample and input."""
    samples = []
    for index, setting in enumerate(config.model_warmup):
        if setting.batch_size == 0:  # Triton skips these
            continue
        where = f"{source}: model_warmup[{index}] '{setting.name}'"
        inputs = {
            name: _input(where, name, spec, config, setting.batch_size, model_dir)
            for name, spec in sorted(setting.inputs.items())
        }
        samples.append(WarmupSample(setting.name, max(1, setting.count), inputs))
    return tuple(samples)


def warmup_problems(config: ModelConfig) -> list[str]:
    """What is wrong with the samples in the config alone (files are read at load)."""
    problems: list[str] = []
    inputs = {tensor.name: tensor for tensor in config.input}
    for index, setting in enumerate(config.model_warmup):
        where = f"model_warmup[{index}] '{setting.name}'"
        if config.max_batch_size <= 0 and setting.batch_size > 1:
            problems.append(
                f"{where}: batch_size {setting.batch_size} must be 1 for a model that does not "
                "batch (max_batch_size 0)"
            )
        elif config.max_batch_size > 0 and setting.batch_size > config.max_batch_size:
            problems.append(
                f"{where}: batch_size {setting.batch_size} exceeds max_batch_size "
                f"{config.max_batch_size}"
            )
        if setting.count > MAX_COUNT:
            problems.append(f"{where}: count {setting.count} is over {MAX_COUNT}")
        for name, spec in sorted(setting.inputs.items()):
            problems += _input_problems(f"{where}: input '{name}'", spec, inputs.get(name))
        missing = [
            name for name, t in inputs.items() if not t.optional and name not in setting.inputs
        ]
        if setting.batch_size and missing:
            problems.append(f"{where}: gives no data for required input(s) {missing}")
    return problems


def _input_problems(what: str, spec: ModelWarmup.Input, tensor: ModelInput | None) -> list[str]:
    if tensor is None:
        return [f"{what} is not an input of the model"]
    problems = []
    if spec.data_type != tensor.data_type:
        problems.append(f"{what}: data_type differs from the input's")
    dims, expected = list(spec.dims), list(tensor.dims)
    if any(d < 1 for d in dims):
        problems.append(
            f"{what}: warmup setting expects all variable-size dimensions are specified; "
            f"dims {dims} must all be >= 1"
        )
    elif len(dims) != len(expected) or any(
        e not in (-1, d) for d, e in zip(dims, expected, strict=True)
    ):
        problems.append(f"{what}: dims {dims} do not fit the input's dims {expected}")
    if spec.WhichOneof("input_data_type") is None:
        problems.append(f"{what}: set one of zero_data, random_data or input_data_file")
    file = spec.input_data_file
    if file and not inside_folder(file):
        problems.append(f"{what}: input_data_file '{file}' must be a path inside {WARMUP_DIR}/")
    return problems


def _input(
    where: str,
    name: str,
    spec: ModelWarmup.Input,
    config: ModelConfig,
    batch_size: int,
    model_dir: Path,
) -> np.ndarray:
    datatype = from_config(spec.data_type)
    shape = tuple(int(d) for d in spec.dims)
    elements = math.prod(shape)
    if elements * batch_size > MAX_SAMPLE_ELEMENTS:
        raise ModelConfigError(
            f"{where}: input '{name}' asks for {elements * batch_size} elements "
            f"(at most {MAX_SAMPLE_ELEMENTS})"
        )
    choice = spec.WhichOneof("input_data_type")
    if choice == "input_data_file":
        row = tensor_from_file(
            where, name, spec.input_data_file, datatype, shape, model_dir,
            folder=WARMUP_DIR, setting="warmup", field="input_data_file",
            file_kind="a warm-up data file",
        )  # fmt: skip
    elif datatype.wire == "BYTES":
        row = np.full(shape, b"", dtype=object)
    elif choice == "random_data":
        raw = np.random.default_rng().bytes(elements * datatype.numpy.itemsize)
        row = np.frombuffer(raw, dtype=datatype.numpy).reshape(shape).copy()
    else:
        row = np.zeros(shape, dtype=datatype.numpy)
    if config.max_batch_size <= 0:
        return row
    return np.repeat(row[np.newaxis], batch_size, axis=0)
