"""Wire-independent tensor conversions that the HTTP and gRPC codecs share: shapes and sizes
checked, little-endian bytes to and from arrays, Python scalars to arrays, and the request's
limits on tensors.

Every size is checked with Python ints against the limits below before anything is
allocated: numpy's own products wrap around silently at 64 bits. The JSON ``data`` field,
which only HTTP carries, is read and written in ``rest/json_tensors.py``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import Internal, InvalidArgument

Array = npt.NDArray[Any]

MAX_TENSORS: Final = 1024  # inputs, or requested outputs, per request
MAX_RANK: Final = 64  # numpy's own limit on dimensions
MAX_ELEMENTS: Final = 2**31  # per tensor, and per dimension
MAX_BYTES: Final = 2**31  # per tensor
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1
"""The largest element count or byte size Triton computes; past it, its overflow texts."""
COPY_BELOW: Final = 1 << 16  # array_to_bytes copies smaller arrays rather than view them

_PREFIX: Final = struct.Struct("<I")
LITTLE_ENDIAN: Final = {wire: dt.numpy.newbyteorder("<") for wire, dt in BY_WIRE.items()}
"""Each wire type's little-endian numpy dtype (the wire's byte order), built once."""
_CLASS_COUNT_MAX: Final = 2**64  # HTTP: any JSON unsigned integer; gRPC: int64


def describe(value: object) -> str:
    """A short, bounded rendering of a client value for messages (never recursive)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else "a very large integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def format_shape(shape: Iterable[object]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def checked_shape(
    shape: object, *, tensor: str, datatype: DataType | None = None
) -> tuple[int, ...]:
    """The shape as a tuple of ints, rejected before any allocation when absurd; one past
    what a 64-bit count or byte size holds in Triton's words (``datatype``: the tensor's,
    where known, for the byte size)."""
    if type(shape) is not list and type(shape) is not tuple:
        raise InvalidArgument(
            f"tensor '{tensor}': shape must be a list of integers, got {describe(shape)}"
        )
    if len(shape) > MAX_RANK:
        raise InvalidArgument(
            f"tensor '{tensor}': shape has {len(shape)} dimensions (at most {MAX_RANK})"
        )
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= MAX_ELEMENTS:
            _reject_overflow(shape, tensor, datatype)
            _reject_dim(dim, shape, tensor)
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        _reject_overflow(shape, tensor, datatype)
        raise InvalidArgument(
            f"tensor '{tensor}': shape {format_shape(shape)} has {count} elements "
            f"(at most {MAX_ELEMENTS})"
        )
    # numpy refuses even an empty array whose other dimensions multiply past its limit
    if count == 0 and math.prod(dim for dim in shape if dim) > MAX_ELEMENTS:
        raise InvalidArgument(
            f"tensor '{tensor}': shape {format_shape(shape)} has no elements, but its other "
            f"dimensions multiply past {MAX_ELEMENTS}"
        )
    return tuple(shape)


def _reject_overflow(shape: Sequence[object], tensor: str, datatype: DataType | None) -> None:
    """Triton's texts (its HTTP front end's) for a shape of non-negative integers whose
    element count, or byte size, a signed 64-bit integer cannot hold; nothing otherwise."""
    if not all(type(dim) is int and dim >= 0 for dim in shape):
        return
    count = math.prod(shape)  # type: ignore[arg-type]  # ints, just checked
    ours = f"(batchserve: at most {MAX_ELEMENTS} elements)"
    if count > INT64_MAX:
        raise InvalidArgument(
            f"invalid shape for input '{tensor}': shape {format_shape(shape)} causes total "
            f"element count to exceed maximum size of {INT64_MAX} {ours}"
        )
    itemsize = datatype.itemsize if datatype is not None else 0
    if count * itemsize > INT64_MAX:
        raise InvalidArgument(
            f"byte size overflow for input '{tensor}': element count ({count}) * data type "
            f"size ({itemsize}) exceeds maximum allowed size ({INT64_MAX}) {ours}"
        )


def _reject_dim(dim: object, shape: Sequence[object], tensor: str) -> NoReturn:
    if type(dim) is not int:
        raise InvalidArgument(
            f"tensor '{tensor}': shape dimension {describe(dim)} is not an integer"
        )
    if dim < 0:
        raise InvalidArgument(
            f"All input dimensions should be specified for input '{tensor}', got "
            f"{format_shape(shape)} (batchserve: shape dimension {dim} is negative)"
        )
    raise InvalidArgument(
        f"tensor '{tensor}': shape dimension {dim} is too large (at most {MAX_ELEMENTS})"
    )


def byte_size(shape: tuple[int, ...], datatype: DataType, *, tensor: str) -> int:
    """Bytes a fixed-size tensor of this shape takes, checked against MAX_BYTES."""
    size = math.prod(shape) * datatype.itemsize
    if size > MAX_BYTES:
        raise InvalidArgument(
            f"tensor '{tensor}': shape {format_shape(shape)} {datatype.wire} takes {size} bytes "
            f"(at most {MAX_BYTES})"
        )
    return size


class InputDataError(InvalidArgument):
    """An input's data does not match its shape, in Triton's words (core ``infer_request.cc``),
    which name the model after the input: a decoder that does not know the model raises this
    without it, and the request's decoding names it (``for_model``)."""

    def __init__(self, head: str, tail: str, model: str = "") -> None:
        self.head, self.tail = head, tail
        super().__init__(head + (f" for model '{model}'" if model else "") + tail)

    def for_model(self, model: str) -> InputDataError:
        return InputDataError(self.head, self.tail, model)


def check_byte_size(got: int, datatype: DataType, shape: tuple[int, ...], *, tensor: str) -> None:
    """``got`` bytes must be what a fixed-size tensor of this shape takes (Triton's words)."""
    expected = byte_size(shape, datatype, tensor=tensor)
    if got != expected:
        raise InputDataError(
            f"input byte size mismatch for input '{tensor}'",
            f". Expected {expected}, got {got} (batchserve: shape {format_shape(shape)} "
            f"{datatype.wire} takes {expected} bytes)",
        )


def array_from_bytes(
    buf: bytes | memoryview, datatype: DataType, shape: tuple[int, ...], *, tensor: str
) -> Array:
    """A zero-copy, read-only view of little-endian tensor bytes (BYTES: parsed elements)."""
    if datatype.wire == "BYTES":
        return _bytes_elements(buf, shape, tensor)
    check_byte_size(buf.nbytes if isinstance(buf, memoryview) else len(buf), datatype, shape,
                    tensor=tensor)  # fmt: skip
    # twice as fast as np.frombuffer(...).reshape(shape), and the same read-only view
    return np.ndarray(shape, LITTLE_ENDIAN[datatype.wire], buf)


def _bytes_elements(buf: bytes | memoryview, shape: tuple[int, ...], tensor: str) -> Array:
    """Parse 4-byte little-endian length-prefixed elements, in one linear pass. The checks and
    their words are Triton's (``ValidateBytesInputs``): each length prefix whole, then exactly
    the shape's count of elements."""
    count, end = math.prod(shape), memoryview(buf).nbytes
    data = bytes(buf)  # one copy; slicing bytes is then twice as fast as slicing a view
    items: list[bytes] = []
    offset = 0
    where = f" for inference input '{tensor}'"
    for index in range(count):  # at most end / 4 rounds: each element takes 4 bytes or more
        if offset + _PREFIX.size > end:
            if offset < end:
                raise _incomplete_prefix(where, end - offset)
            raise InputDataError(
                f"expected {count} string elements{where}",
                f", got {index} (batchserve: BYTES data ends after {index} of the {count} "
                f"elements of shape {format_shape(shape)})",
            )
        (length,) = _PREFIX.unpack_from(data, offset)
        start = offset + _PREFIX.size
        offset = start + length
        if offset > end:
            raise InputDataError(
                f"string element {index} has length {length}{where}",
                f", but only {end - start} bytes remain (batchserve: BYTES data of shape "
                f"{format_shape(shape)})",
            )
        items.append(data[start:offset])
    if offset != end:
        if end - offset < _PREFIX.size:
            raise _incomplete_prefix(where, end - offset)
        raise InputDataError(
            f"unexpected number of string elements {count + 1}{where}",
            f", expecting {count} (batchserve: {end - offset} bytes left over after the "
            f"{count} BYTES elements of shape {format_shape(shape)})",
        )
    return np.fromiter(items, dtype=object, count=count).reshape(shape)


def _incomplete_prefix(where: str, available: int) -> InputDataError:
    return InputDataError(
        f"incomplete string length indicator{where}",
        f", expecting {_PREFIX.size} bytes but only {available} bytes available. Please make "
        "sure the string length indicator is in one buffer.",
    )


def array_to_bytes(
    array: Array, datatype: DataType, *, tensor: str = "output"
) -> bytes | memoryview:
    """Row-major little-endian bytes: a memoryview of the array itself when it is large
    and contiguous; a copy when small, as ``tobytes()`` is 4x cheaper than the view then."""
    if datatype.wire == "BYTES":
        return _pack_bytes(array)
    native = native_array(array, datatype, tensor)
    return native.tobytes() if native.nbytes < COPY_BELOW else native.data.cast("B")


def _pack_bytes(array: Array) -> bytes:
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=object).reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += (_PREFIX.pack(len(data)), data)
    return b"".join(parts)


def native_array(array: Array, datatype: DataType, tensor: str) -> Array:
    """The array as a C-contiguous little-endian array of the datatype's element type."""
    arr = np.ascontiguousarray(array)
    return arr if arr.dtype == datatype.numpy else _converted(arr, datatype, tensor)


def _converted(arr: Array, datatype: DataType, tensor: str) -> Array:
    """The rare cases: ml_dtypes.bfloat16 arrays, big-endian arrays, wrong dtypes."""
    if datatype.wire == "BF16" and arr.dtype.itemsize == 2 and arr.dtype.kind in "uV":
        arr = arr.view(np.uint16)  # ml_dtypes.bfloat16 has kind "V"
    if (arr.dtype.kind, arr.dtype.itemsize) != (datatype.numpy.kind, datatype.numpy.itemsize):
        raise Internal(
            f"tensor '{tensor}': array of dtype {arr.dtype} cannot be sent as {datatype.wire}"
        )
    if arr.dtype.byteorder == ">":
        arr = arr.astype(LITTLE_ENDIAN[datatype.wire])
    return arr


def array_from_values(
    values: Sequence[Any], datatype: DataType, shape: tuple[int, ...], *, tensor: str
) -> Array:
    """Python scalars (already of the right kind, count already checked) as an array."""
    if datatype.wire == "BYTES":
        return np.fromiter(values, dtype=object, count=len(values)).reshape(shape)
    try:
        with np.errstate(over="raise"):
            array = np.fromiter(values, dtype=datatype.numpy, count=len(values))
    except (OverflowError, FloatingPointError) as error:
        raise InvalidArgument(
            f"tensor '{tensor}': a value is out of range for {datatype.wire} ({error})"
        ) from None
    return array.reshape(shape)


def check_count(count: int, *, what: str) -> None:
    """Bound the number of tensors named in one request (CVE-2026-24146)."""
    if count > MAX_TENSORS:
        raise InvalidArgument(f"request names {count} {what}s (at most {MAX_TENSORS})")


def check_unique(names: Sequence[str], *, what: str) -> None:
    if len(names) < 2 or len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(
                f"{what} '{name}' already exists in request (batchserve: each {what} may be "
                "named once)"
            )
        seen.add(name)


def check_output_parameters(parameters: Mapping[str, object], *, tensor: str) -> None:
    """An output goes to a shared-memory region or is classified, never both (as Triton)."""
    if "shared_memory_region" in parameters and "classification" in parameters:
        raise InvalidArgument(
            "Output can't set both 'shared_memory_region' and 'classification': "
            f"output '{tensor}': a classified output cannot be placed in shared memory"
        )


def class_count(value: object, *, tensor: str) -> int:
    """A requested output's ``classification`` parameter: how many classes to return."""
    if type(value) is not int or not 0 < value < _CLASS_COUNT_MAX:
        raise InvalidArgument(
            "invalid value for 'classification' parameter, expected >= 0: output "
            f"'{tensor}': classification must be an integer >= 1, got {describe(value)}"
        )
    return value
