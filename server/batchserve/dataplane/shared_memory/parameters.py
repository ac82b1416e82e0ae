"""A tensor's shared-memory parameters, as the codecs read them: where its bytes are.

A tensor is in shared memory when its parameters hold ``shared_memory_region`` (with
``shared_memory_byte_size`` and optionally ``shared_memory_offset``), as tritonclient's
``set_shared_memory`` sets them. Kept apart from the regions themselves so that the codecs
import no runtime code; the words of the errors are Triton's (``src/grpc/grpc_utils.h``
``ParseSharedMemoryParams``, ``src/http_server.cc``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import UINT64_MAX, Array, describe

REGION: Final = "shared_memory_region"
OFFSET: Final = "shared_memory_offset"
BYTE_SIZE: Final = "shared_memory_byte_size"


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
    """An offset or byte size as Triton's HTTP front end reads it, any JSON unsigned 64-bit
    integer (gRPC's int64_param cannot go past 2**63 - 1): where it does not fit its region
    the region's own check refuses it in Triton's words (``SharedMemoryManager.region``), as
    Triton's shared-memory tests expect, rather than this parse in words of its own."""
    if type(value) is not int or not 0 <= value <= UINT64_MAX:
        raise InvalidArgument(
            f"invalid value for '{key}' parameter for tensor '{tensor}': expected an integer "
            f"in 0..{UINT64_MAX}, got {describe(value)}"
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
