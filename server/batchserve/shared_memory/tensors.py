"""Inputs read from, and outputs written to, the regions their parameters name.

A tensor is in shared memory when its parameters hold ``shared_memory_region`` (with
``shared_memory_byte_size`` and optionally ``shared_memory_offset``), as tritonclient's
``set_shared_memory`` sets them. The codecs only carry those parameters (an input's data
is a placeholder until ``read_inputs`` fills it); the words of the errors are Triton's
(``src/grpc/grpc_utils.h`` ``ParseSharedMemoryParams``, ``src/http_server.cc``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from batchserve.datatypes import DataType
from batchserve.errors import InvalidArgument
from batchserve.shared_memory.manager import SharedMemoryManager
from batchserve.tensors import MAX_BYTES, Array, array_from_bytes, array_to_bytes, describe
from batchserve.types import InferRequest, RequestedOutput, Tensor

REGION: Final = "shared_memory_region"
OFFSET: Final = "shared_memory_offset"
BYTE_SIZE: Final = "shared_memory_byte_size"
MAX_OFFSET: Final = 2**63 - 1  # an int64_param, as tritonclient sends it


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a tensor's bytes are: ``byte_size`` bytes at ``offset`` of region ``region``."""

    region: str
    offset: int
    byte_size: int


def placement(parameters: Mapping[str, object], tensor: str) -> Placement | None:
    """The tensor's shared-memory parameters, checked; None when it names no region."""
    if REGION not in parameters:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidArgument(
                    f"'{key}' can not be specified without '{REGION}' parameter for tensor "
                    f"'{tensor}'"
                )
        return None
    region = parameters[REGION]
    if type(region) is not str or not region:
        raise InvalidArgument(
            f"invalid value type for '{REGION}' parameter for tensor '{tensor}', expected a "
            f"region name (string), got {describe(region)}"
        )
    if BYTE_SIZE not in parameters:
        raise InvalidArgument(f"tensor '{tensor}': '{REGION}' needs a '{BYTE_SIZE}' parameter")
    return Placement(
        region,
        _size(parameters.get(OFFSET, 0), OFFSET, tensor),
        _size(parameters[BYTE_SIZE], BYTE_SIZE, tensor),
    )


def _size(value: object, key: str, tensor: str) -> int:
    limit = MAX_BYTES if key == BYTE_SIZE else MAX_OFFSET
    if type(value) is not int or not 0 <= value <= limit:
        raise InvalidArgument(
            f"invalid value for '{key}' parameter for tensor '{tensor}': expected an integer "
            f"in 0..{limit}, got {describe(value)}"
        )
    return value


def placeholder(
    parameters: Mapping[str, object],
    has_data: bool,
    datatype: DataType,
    shape: tuple[int, ...],
    tensor: str,
) -> Array | None:
    """What the codecs give an input in shared memory (None when it is not) until
    ``read_inputs`` copies the region's bytes: zeros of the right shape and type taking one
    element of memory. Its parameters are checked here, with the request's other fields."""
    if placement(parameters, tensor) is None:
        return None
    if has_data:
        raise InvalidArgument(
            f"tensor '{tensor}': has both '{REGION}' and data in the request; send one of them"
        )
    return np.broadcast_to(np.zeros((), dtype=datatype.numpy), shape)


def read_inputs(request: InferRequest, manager: SharedMemoryManager) -> None:
    """Replace each shared-memory input's placeholder by a copy of its region's bytes."""
    for tensor in request.inputs:
        if REGION not in tensor.parameters:
            continue
        where = placement(tensor.parameters, tensor.name)
        assert where is not None
        region = manager.region(where.region, where.offset, where.byte_size)
        data = region.read(where.offset, where.byte_size, tensor.name)
        tensor.data = array_from_bytes(data, tensor.datatype, tensor.shape, tensor=tensor.name)


def output_placements(outputs: Sequence[RequestedOutput] | None) -> dict[str, Placement]:
    """The requested outputs to be written into shared memory, by name."""
    found: dict[str, Placement] = {}
    for output in outputs or ():
        where = placement(output.parameters, output.name)
        if where is not None:
            found[output.name] = where
    return found


def check_outputs(request: InferRequest, manager: SharedMemoryManager) -> None:
    """Refuse, before the model runs, outputs whose region is unknown or too short."""
    for where in output_placements(request.outputs).values():
        manager.region(where.region, where.offset, where.byte_size)


def write_outputs(
    outputs: list[Tensor], placements: dict[str, Placement], manager: SharedMemoryManager
) -> None:
    """Copy each output placed in shared memory there and mark it so the codecs send no data."""
    for tensor in outputs:
        where = placements.get(tensor.name)
        if where is None:
            continue
        raw = array_to_bytes(tensor.data, tensor.datatype, tensor=tensor.name)
        size = memoryview(raw).nbytes
        if size > where.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{tensor.name}' "
                f"({where.byte_size} bytes) should be at least {size} bytes to hold the results"
            )
        region = manager.region(where.region, where.offset, where.byte_size)
        region.write(where.offset, raw, tensor.name)
        tensor.in_shared_memory = True
