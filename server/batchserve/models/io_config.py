"""Triton's ValidateModelIOConfig, for each tensor a config lists: a name, three dims for an
NHWC/NCHW input, and shape tensors and non-linear formats on TensorRT only, in its words
("... for <model>"); each with what batchserve found, so every problem is said at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from batchserve.backends.selection import TENSORRT
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput

_LAYOUTS = (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW)


def io_problems(config: ModelConfig) -> list[str]:
    """Every listed input and output Triton's IO checks refuse."""
    return [f"{triton} for {config.name} (batchserve: {ours})" for triton, ours in _found(config)]


def _found(config: ModelConfig) -> Iterator[tuple[str, str]]:
    on_tensorrt = config.platform == TENSORRT.platform
    listed: tuple[tuple[str, Sequence[ModelInput | ModelOutput]], ...] = (
        ("input", config.input),
        ("output", config.output),
    )
    for kind, tensors in listed:
        for position, tensor in enumerate(tensors):
            where = f"{kind}[{position}]"
            if not tensor.name:
                yield f"model {kind} must specify 'name'", f"{where} has no name"
                continue
            where = f"{kind} '{tensor.name}'"
            layout = tensor.format if isinstance(tensor, ModelInput) else None
            if layout in _LAYOUTS and len(tensor.dims) != 3:
                yield (
                    "model input NHWC/NCHW require 3 dims",
                    f"{where} has format {ModelInput.Format.Name(layout)} and dims "
                    f"{list(tensor.dims)}: a layout names 3 dims, batch axis aside",
                )
            if tensor.is_shape_tensor and not on_tensorrt:
                yield (
                    "shape tensors are only supported for TensorRT platform",
                    f"{where} is a shape tensor on platform '{config.platform}'",
                )
            if tensor.is_non_linear_format_io and not on_tensorrt:
                yield (
                    "Non-linear IO format is only supported for the TensorRT platform",
                    f"{where} has a non-linear format on platform '{config.platform}'",
                )
