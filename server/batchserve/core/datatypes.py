"""The three spellings of a tensor's element type, and the one table joining them.

The wire protocol says "FP32", config.pbtxt says TYPE_FP32, numpy says float32.
BYTES (TYPE_STRING) is carried as numpy object arrays of ``bytes``; BF16 has no
numpy dtype and travels as raw 2-byte elements (uint16 views).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from batchserve.core.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class DataType:
    """One element type: protocol name, config enum value, numpy dtype, item size."""

    wire: str
    config: int
    numpy: np.dtype[np.generic]
    itemsize: int  # bytes per element on the wire; 0 for variable-length BYTES


def _dt(wire: str, config: int, numpy_type: str, itemsize: int) -> DataType:
    return DataType(wire, config, np.dtype(numpy_type), itemsize)


# Config enum values are those of inference.DataType in model_config.proto.
_ALL: Final[tuple[DataType, ...]] = (
    _dt("BOOL", 1, "bool", 1),
    _dt("UINT8", 2, "uint8", 1),
    _dt("UINT16", 3, "uint16", 2),
    _dt("UINT32", 4, "uint32", 4),
    _dt("UINT64", 5, "uint64", 8),
    _dt("INT8", 6, "int8", 1),
    _dt("INT16", 7, "int16", 2),
    _dt("INT32", 8, "int32", 4),
    _dt("INT64", 9, "int64", 8),
    _dt("FP16", 10, "float16", 2),
    _dt("FP32", 11, "float32", 4),
    _dt("FP64", 12, "float64", 8),
    _dt("BYTES", 13, "object", 0),
    _dt("BF16", 14, "uint16", 2),
)

BY_WIRE: Final[dict[str, DataType]] = {d.wire: d for d in _ALL}
BY_CONFIG: Final[dict[int, DataType]] = {d.config: d for d in _ALL}
BYTES: Final[DataType] = BY_WIRE["BYTES"]


def from_wire(name: str, *, tensor: str) -> DataType:
    """Resolve a protocol datatype name, naming the tensor when it is unknown."""
    try:
        return BY_WIRE[name]
    except (KeyError, TypeError):
        known = ", ".join(BY_WIRE)
        raise InvalidArgument(
            f"tensor '{tensor}': unknown datatype {name!r} (expected one of {known})"
        ) from None


def from_config(value: int) -> DataType:
    """Resolve a config.pbtxt data_type enum value (TYPE_INVALID is rejected)."""
    try:
        return BY_CONFIG[value]
    except KeyError:
        raise InvalidArgument(f"data type {value} is not a valid tensor type") from None


def config_name(value: int) -> str:
    """TYPE_FP32-style name of a config enum value, for messages."""
    dt = BY_CONFIG.get(value)
    if dt is None:
        return "TYPE_INVALID"
    return "TYPE_STRING" if dt.wire == "BYTES" else f"TYPE_{dt.wire}"


def from_numpy(dtype: np.dtype[np.generic]) -> DataType:
    """Resolve a numpy dtype (object and bytes_ arrays are BYTES)."""
    if dtype.kind in ("O", "S"):
        return BYTES
    for dt in _ALL:
        if dt.numpy == dtype and dt.wire != "BF16":
            return dt
    raise InvalidArgument(f"numpy dtype {dtype} has no protocol datatype")
