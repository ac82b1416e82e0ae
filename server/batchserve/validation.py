"""Checking a decoded request against the model it is addressed to.

The codecs have already checked that each tensor is self-consistent (shape against
data); this module checks it against the model's configuration, once for both protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchserve.datatypes import from_config
from batchserve.errors import InvalidArgument
from batchserve.grpc.generated.model_config_pb2 import ModelConfig, ModelInput
from batchserve.types import RequestedOutput, Tensor


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """Validated arrays, keyed by input name, and what to send back."""

    inputs: dict[str, np.ndarray]
    batch_size: int
    output_names: tuple[str, ...]


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _check_dims(tensor: Tensor, spec: ModelInput, batched: bool, max_batch: int) -> None:
    expected = ([-1] if batched else []) + list(spec.dims)
    shape = tensor.shape
    mismatch = len(shape) != len(expected) or any(
        e != -1 and e != s for e, s in zip(expected, shape, strict=False)
    )
    if mismatch:
        raise InvalidArgument(
            f"input '{tensor.name}': shape {_dims_text(shape)} does not match the model's "
            f"{_dims_text(expected)} (-1 is any size)"
        )
    if batched and not 1 <= shape[0] <= max_batch:
        raise InvalidArgument(
            f"input '{tensor.name}': batch size {shape[0]} is outside 1..{max_batch} "
            "(the model's max_batch_size)"
        )


def _check_input(tensor: Tensor, spec: ModelInput, config: ModelConfig) -> None:
    expected = from_config(spec.data_type)
    if tensor.datatype is not expected:
        raise InvalidArgument(
            f"input '{tensor.name}': datatype {tensor.datatype.wire} does not match the "
            f"model's {expected.wire}"
        )
    _check_dims(tensor, spec, config.max_batch_size > 0, config.max_batch_size)


def _index_inputs(inputs: Sequence[Tensor], config: ModelConfig) -> dict[str, Tensor]:
    by_name: dict[str, Tensor] = {}
    known = {spec.name for spec in config.input}
    for tensor in inputs:
        if tensor.name in by_name:
            raise InvalidArgument(f"input '{tensor.name}' appears more than once")
        if tensor.name not in known:
            raise InvalidArgument(
                f"unexpected input '{tensor.name}': model '{config.name}' takes {sorted(known)}"
            )
        by_name[tensor.name] = tensor
    return by_name


def _batch_size(tensors: Sequence[Tensor], config: ModelConfig) -> int:
    if config.max_batch_size <= 0:
        return 1
    sizes = {t.shape[0] for t in tensors}
    if len(sizes) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size: {sorted(sizes)}")
    return sizes.pop()


def _output_names(
    requested: Sequence[RequestedOutput] | None, config: ModelConfig
) -> tuple[str, ...]:
    known = [spec.name for spec in config.output]
    if requested is None or not requested:
        return tuple(known)
    names = tuple(output.name for output in requested)
    if len(set(names)) != len(names):
        raise InvalidArgument(f"an output is requested more than once: {list(names)}")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InvalidArgument(
            f"unknown output '{unknown[0]}': model '{config.name}' produces {known}"
        )
    return names


def validate_request(
    inputs: Sequence[Tensor], outputs: Sequence[RequestedOutput] | None, config: ModelConfig
) -> ValidRequest:
    """Every input present once, typed and shaped as configured; outputs known."""
    by_name = _index_inputs(inputs, config)
    for spec in config.input:
        tensor = by_name.get(spec.name)
        if tensor is None:
            if not spec.optional:
                raise InvalidArgument(f"missing input '{spec.name}' of model '{config.name}'")
            continue
        _check_input(tensor, spec, config)
    return ValidRequest(
        inputs={name: tensor.data for name, tensor in by_name.items()},
        batch_size=_batch_size(list(by_name.values()), config),
        output_names=_output_names(outputs, config),
    )
