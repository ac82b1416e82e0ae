"""What a TensorRT engine's optimisation profiles accept, and which one a batch runs on.

Pure functions of shapes and the model config (the engine's figures are read once at load),
so the rules are tested without TensorRT or a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import best_profile
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.device import Device
from batchserve.core.digits import MAX_INT64_DIGITS, ascii_digits
from batchserve.core.errors import InvalidArgument, ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

_TRT_TO_WIRE = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}
_GPU_KINDS = (ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_AUTO)


def datatype_from_trt(trt_name: str, tensor: str, path: Path) -> DataType:
    """The protocol datatype of a ``tensorrt.DataType`` member name (FP8, INT4... have none)."""
    wire = _TRT_TO_WIRE.get(trt_name)
    if wire is None:
        raise ModelConfigError(
            f"{path}: tensor '{tensor}' has TensorRT type {trt_name}, unsupported"
        )
    return BY_WIRE[wire]


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One I/O tensor of an engine under one optimisation profile, or across several.

    Args:
        name: tensor name in the engine.
        datatype: element type.
        is_input: True for inputs.
        min_shape: smallest shape accepted (outputs: same as ``max_shape``).
        max_shape: largest shape; buffers are sized for it.
    """

    name: str
    datatype: DataType
    is_input: bool
    min_shape: tuple[int, ...]
    max_shape: tuple[int, ...]

    @property
    def max_bytes(self) -> int:
        return math.prod(self.max_shape) * self.datatype.itemsize


def check_inputs(tensors: Sequence[EngineTensor], inputs: Arrays, model: str) -> None:
    """Raise InvalidArgument, naming the tensor, unless ``inputs`` fit the engine's profile."""
    expected = {t.name: t for t in tensors if t.is_input}
    unknown, missing = sorted(set(inputs) - set(expected)), sorted(set(expected) - set(inputs))
    if unknown or missing:
        raise InvalidArgument(
            f"model '{model}': the engine takes inputs {sorted(expected)}; "
            f"unknown {unknown}, missing {missing}"
        )
    for tensor in expected.values():
        _check_input(tensor, inputs[tensor.name], model)


def _check_input(tensor: EngineTensor, array: np.ndarray, model: str) -> None:
    if array.dtype != tensor.datatype.numpy:
        raise InvalidArgument(
            f"model '{model}': input '{tensor.name}' has numpy dtype {array.dtype}, "
            f"but the engine expects {tensor.datatype.wire}"
        )
    bounds = zip(array.shape, tensor.min_shape, tensor.max_shape, strict=False)
    if len(array.shape) != len(tensor.min_shape) or any(
        not lo <= dim <= hi for dim, lo, hi in bounds
    ):
        raise InvalidArgument(
            f"model '{model}': input '{tensor.name}' has shape {list(array.shape)}; the engine's "
            f"optimisation profile accepts {list(tensor.min_shape)} to {list(tensor.max_shape)}"
        )


def instance_profiles(
    config: ModelConfig, device: Device, profiles: int, path: Path
) -> tuple[int, ...]:
    """The optimisation profiles an instance on ``device`` may use, as Triton reads them.

    The first GPU instance group covering the device that lists ``profile`` gives them;
    otherwise every profile of the engine is available. Each batch then runs on the
    profile that fits it best (``best_profile``).
    """
    for group in config.instance_group:
        covers = not group.gpus or device.index in group.gpus
        if group.kind in _GPU_KINDS and covers and group.profile:
            return tuple(_profile_index(value, profiles, path) for value in group.profile)
    return tuple(range(max(profiles, 1)))


def _profile_index(value: str, profiles: int, path: Path) -> int:
    if not ascii_digits(value) or len(value) > MAX_INT64_DIGITS or int(value) >= profiles:
        raise ModelConfigError(
            f"{path}: instance_group profile {value!r} is not one of the engine's "
            f"{profiles} optimisation profiles (0..{profiles - 1})"
        )
    return int(value)


@dataclass(frozen=True, slots=True)
class Profile:
    """One optimisation profile's input ranges and the batch size it was tuned for."""

    index: int
    inputs: Mapping[str, EngineTensor]
    opt_batch: int

    def accepts(self, inputs: Arrays) -> bool:
        return all(_within(tensor, inputs[name].shape) for name, tensor in self.inputs.items())


def _within(tensor: EngineTensor, shape: tuple[int, ...]) -> bool:
    if len(shape) != len(tensor.min_shape):
        return False
    bounds = zip(shape, tensor.min_shape, tensor.max_shape, strict=True)
    return all(low <= dim <= high for dim, low, high in bounds)


def pick_profile(profiles: Sequence[Profile], inputs: Arrays) -> int | None:
    """The profile for a batch: of those accepting every input's shape, the best tuned."""
    rows = next((int(a.shape[0]) for a in inputs.values() if a.ndim), 1)
    candidates = [(p.index, p.opt_batch) for p in profiles if p.accepts(inputs)]
    return best_profile(rows, candidates)


def union_tensor(tensors: Sequence[EngineTensor]) -> EngineTensor:
    """One tensor accepting what any of ``tensors`` (one per profile) accepts; buffers fit all."""
    first = tensors[0]
    low = tuple(min(dims) for dims in zip(*(t.min_shape for t in tensors), strict=True))
    high = tuple(max(dims) for dims in zip(*(t.max_shape for t in tensors), strict=True))
    return EngineTensor(first.name, first.datatype, first.is_input, low, high)
