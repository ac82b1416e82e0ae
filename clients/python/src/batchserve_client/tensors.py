"""numpy arrays to and from the protocol's tensor encodings.

- A datatype is inferred from the array's dtype (bytes, str and object arrays are BYTES)
  unless the caller names one; numeric arrays are cast to it when numpy calls that safe
  or of the same kind.
- Raw tensor bytes are row-major and little-endian; each BYTES element is prefixed by its
  length as 4 little-endian bytes.
- BF16 has no numpy dtype: float arrays are rounded to it (to nearest even), uint16 arrays
  are taken as its bit patterns, and BF16 outputs come back as float32, exactly.
- BYTES outputs come back as object arrays of ``bytes``.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from batchserve_client.errors import InvalidArgument, InvalidResponse

Array = npt.NDArray[Any]

DTYPES: Final[dict[str, np.dtype[Any]]] = {
    wire: np.dtype(name)
    for wire, name in (
        ("BOOL", "bool"),
        ("UINT8", "<u1"),
        ("UINT16", "<u2"),
        ("UINT32", "<u4"),
        ("UINT64", "<u8"),
        ("INT8", "<i1"),
        ("INT16", "<i2"),
        ("INT32", "<i4"),
        ("INT64", "<i8"),
        ("FP16", "<f2"),
        ("FP32", "<f4"),
        ("FP64", "<f8"),
        ("BYTES", "object"),
        ("BF16", "<u2"),
    )
}
_BY_DTYPE: Final = {
    (dtype.kind, dtype.itemsize): wire for wire, dtype in DTYPES.items() if wire != "BF16"
}
_PREFIX: Final = struct.Struct("<I")


def datatype_of(array: Array, *, name: str) -> str:
    """The wire datatype numpy's dtype stands for."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    wire = _BY_DTYPE.get((array.dtype.kind, array.dtype.itemsize))
    if wire is None:
        raise InvalidArgument(
            f"input '{name}': arrays of dtype {array.dtype} have no protocol datatype; "
            "convert it or name a datatype"
        )
    return wire


def prepare(value: npt.ArrayLike, datatype: str | None, *, name: str) -> tuple[str, Array]:
    """The input's wire datatype, and the input as an array of that datatype's dtype."""
    array = np.asarray(value)
    wire = datatype_of(array, name=name) if datatype is None else datatype.upper()
    if wire not in DTYPES:
        raise InvalidArgument(f"input '{name}': unknown datatype {datatype!r}")
    if wire == "BYTES":
        return wire, _bytes_array(array, name)
    if wire == "BF16":
        return wire, _bf16_bits(array, name)
    target = DTYPES[wire]
    if not np.can_cast(array.dtype, target, casting="same_kind"):
        raise InvalidArgument(f"input '{name}': dtype {array.dtype} cannot be sent as {wire}")
    return wire, np.ascontiguousarray(array, dtype=target)


def _bytes_array(array: Array, name: str) -> Array:
    """An object array of ``bytes``; str elements are encoded as UTF-8."""
    items = array.reshape(-1).tolist()
    for index, item in enumerate(items):
        if isinstance(item, str):
            items[index] = item.encode()
        elif not isinstance(item, bytes):
            raise InvalidArgument(
                f"input '{name}': BYTES elements must be bytes or str, got {type(item).__name__}"
            )
    return _objects(items).reshape(array.shape)


def _objects(items: list[Any]) -> Array:
    """A 1-D object array of the items (np.array would nest sequences instead)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _bf16_bits(array: Array, name: str) -> Array:
    """BF16 bit patterns: uint16 as they are, floats rounded to the nearest even."""
    if array.dtype == np.uint16:
        return np.ascontiguousarray(array, dtype=DTYPES["BF16"])
    if array.dtype.kind != "f":
        raise InvalidArgument(f"input '{name}': dtype {array.dtype} cannot be sent as BF16")
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = np.where(np.isnan(array), 0x7FC0, rounded)  # keep NaN a NaN
    return rounded.astype(DTYPES["BF16"])


def to_bytes(array: Array, datatype: str) -> bytes:
    """The raw wire bytes of an array ``prepare`` returned."""
    if datatype != "BYTES":
        return array.tobytes()
    parts: list[bytes] = []
    for item in array.reshape(-1).tolist():
        parts += (_PREFIX.pack(len(item)), item)
    return b"".join(parts)


def from_bytes(data: bytes | memoryview, datatype: str, shape: tuple[int, ...]) -> Array:
    """An output's raw wire bytes as an array (read-only: a view of the response)."""
    if datatype == "BYTES":
        return _bytes_elements(memoryview(data), shape)
    dtype = _dtype(datatype)
    expected, got = math.prod(shape) * dtype.itemsize, memoryview(data).nbytes
    if got != expected:
        raise InvalidResponse(
            f"output has {got} bytes, shape {list(shape)} {datatype} needs {expected}"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    return _bf16_to_float32(array) if datatype == "BF16" else array


def _dtype(datatype: str) -> np.dtype[Any]:
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise InvalidResponse(f"unknown output datatype {datatype!r}")
    return dtype


def _bytes_elements(data: memoryview, shape: tuple[int, ...]) -> Array:
    count, offset = math.prod(shape), 0
    buffer = bytes(data)
    out = np.empty(count, dtype=object)
    for index in range(count):
        if offset + _PREFIX.size > len(buffer):
            raise InvalidResponse(f"BYTES output ends after {index} of {count} elements")
        (length,) = _PREFIX.unpack_from(buffer, offset)
        start, offset = offset + _PREFIX.size, offset + _PREFIX.size + length
        if offset > len(buffer):
            raise InvalidResponse(f"BYTES output element {index} runs past the data")
        out[index] = buffer[start:offset]
    if offset != len(buffer):
        raise InvalidResponse(f"BYTES output has {len(buffer) - offset} bytes left over")
    return out.reshape(shape)


def _bf16_to_float32(bits: Array) -> Array:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_json(array: Array, datatype: str, *, name: str) -> list[Any]:
    """Flat JSON ``data`` of an array ``prepare`` returned."""
    if datatype == "BF16":
        raise InvalidArgument(f"input '{name}': BF16 cannot be sent as JSON; send binary data")
    if datatype != "BYTES":
        values: list[Any] = array.reshape(-1).tolist()
        return values
    try:
        return [item.decode() for item in array.reshape(-1).tolist()]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input '{name}': BYTES that are not UTF-8 cannot be sent as JSON; send binary data"
        ) from None


def from_json(data: object, datatype: str, shape: tuple[int, ...]) -> Array:
    """An output's JSON ``data`` (flat or nested) as an array."""
    if not isinstance(data, list):
        raise InvalidResponse(f"output data must be a JSON array, got {type(data).__name__}")
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1).tolist()
            return _objects([s.encode() if isinstance(s, str) else s for s in flat]).reshape(shape)
        dtype = np.dtype(np.float32) if datatype == "BF16" else _dtype(datatype)
        return np.asarray(data, dtype=dtype).reshape(shape)
    except (ValueError, TypeError) as error:
        raise InvalidResponse(f"output data does not fit shape {list(shape)}: {error}") from None
