"""Wire-independent conversions that the HTTP and gRPC codecs share.

Every size is checked with Python ints against the limits below before anything is
allocated: numpy's own products wrap around silently at 64 bits. Protocol choices:

- JSON ``data`` may be flat or nested in any way, as Triton reads it: the values are
  taken in row-major (depth-first) order and only their count must match the shape.
  Nesting is capped at 100 levels (Triton's limit) against hostile bodies.
- BF16 cannot be sent as JSON numbers (numpy has no bfloat16 to round them into, and
  tritonclient refuses too): send it as binary data. BF16 outputs are written to JSON
  as their exact values.
- FP16/FP32 JSON numbers outside the type's range are rejected, not turned into inf.
- BYTES elements are JSON strings (UTF-8). JSON has no NaN or infinity: such numbers in
  a request are malformed JSON (send them as binary data).
- An output JSON cannot carry exactly (BYTES that are not UTF-8, NaN or infinity) raises
  ``NotJsonRepresentable``; the HTTP codec then sends that output as binary data instead.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt
import orjson

from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import Internal, InvalidArgument

Array = npt.NDArray[Any]

MAX_TENSORS: Final = 1024  # inputs, or requested outputs, per request
MAX_RANK: Final = 64  # numpy's own limit on dimensions
MAX_ELEMENTS: Final = 2**31  # per tensor, and per dimension
MAX_BYTES: Final = 2**31  # per tensor
MAX_JSON_DEPTH: Final = 100  # Triton's limit
JSON_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY  # what array_to_json's arrays need
COPY_BELOW: Final = 1 << 16  # array_to_bytes copies smaller arrays rather than view them

_PREFIX: Final = struct.Struct("<I")
_LITTLE_ENDIAN: Final = {wire: dt.numpy.newbyteorder("<") for wire, dt in BY_WIRE.items()}
_INTEGERS: Final = (frozenset({int}), "integers")
_NUMBERS: Final = (frozenset({int, float}), "numbers")
# The exact JSON value types each datatype accepts (bool is not an int here).
_JSON_KINDS: Final[dict[str, tuple[frozenset[type], str]]] = {
    **dict.fromkeys(("INT8", "INT16", "INT32", "INT64"), _INTEGERS),
    **dict.fromkeys(("UINT8", "UINT16", "UINT32", "UINT64"), _INTEGERS),
    **dict.fromkeys(("FP16", "FP32", "FP64"), _NUMBERS),
    "BOOL": (frozenset({bool}), "true or false"),
    "BYTES": (frozenset({str}), "strings"),
}
_SEQUENCE_KEYS: Final = ("sequence_id", "sequence_start", "sequence_end")
# The one reserved key Triton's clients send (perf_analyzer over gRPC): decoupled models only
_EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
# Triton's two texts for a data count that does not match the shape (http_server.cc)
_TOO_MANY: Final = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_TOO_FEW: Final = "Failed to parse 'data' field: shape does not match true shape"
_CLASS_COUNT_MAX: Final = 2**64  # HTTP: any JSON unsigned integer; gRPC: int64


class NotJsonRepresentable(InvalidArgument):
    """The tensor cannot be written as JSON (BYTES that are not UTF-8, NaN, infinity)."""


@dataclass(slots=True)
class RequestOptions:
    """Request-level parameters with a meaning, split from the ones passed through.

    Args:
        priority: 0 = the model's default level.
        timeout_us: 0 = the model's default queue timeout.
        binary_output: HTTP ``binary_data_output``.
        parameters: every other key, unchanged.
    """

    priority: int
    timeout_us: int
    binary_output: bool
    parameters: dict[str, Any]


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


def checked_shape(shape: object, *, tensor: str) -> tuple[int, ...]:
    """The shape as a tuple of ints, rejected before any allocation when absurd."""
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
            _reject_dim(dim, shape, tensor)
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
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


def check_byte_size(got: int, datatype: DataType, shape: tuple[int, ...], *, tensor: str) -> None:
    """``got`` bytes must be what a fixed-size tensor of this shape takes (Triton's words)."""
    expected = byte_size(shape, datatype, tensor=tensor)
    if got != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{tensor}'. Expected {expected}, got {got} "
            f"(batchserve: shape {format_shape(shape)} {datatype.wire} takes {expected} bytes)"
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
    return np.ndarray(shape, _LITTLE_ENDIAN[datatype.wire], buf)


def _bytes_elements(buf: bytes | memoryview, shape: tuple[int, ...], tensor: str) -> Array:
    """Parse 4-byte little-endian length-prefixed elements, in one linear pass."""
    count, end = math.prod(shape), memoryview(buf).nbytes
    if count * _PREFIX.size > end:
        raise InvalidArgument(
            f"expected {count} string elements for inference input '{tensor}', got fewer "
            f"(batchserve: {end} bytes cannot hold the {count} BYTES elements of shape "
            f"{format_shape(shape)}; each has a 4-byte length prefix)"
        )
    data = bytes(buf)  # one copy; slicing bytes is then twice as fast as slicing a view
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + _PREFIX.size > end:
            raise InvalidArgument(
                f"expected {count} string elements for inference input '{tensor}', got "
                f"{index} (batchserve: BYTES data ends after {index} of the {count} elements "
                f"of shape {format_shape(shape)})"
            )
        (length,) = _PREFIX.unpack_from(data, offset)
        start = offset + _PREFIX.size
        offset = start + length
        if offset > end:
            raise InvalidArgument(
                f"expected {count} string elements for inference input '{tensor}', got "
                f"{index} (batchserve: BYTES element {index} has length {length} but only "
                f"{end - start} bytes remain)"
            )
        items.append(data[start:offset])
    if offset != end:
        raise InvalidArgument(
            f"unexpected number of string elements {count + 1} for inference input "
            f"'{tensor}', expecting {count} (batchserve: {end - offset} bytes left over after "
            f"the {count} BYTES elements of shape {format_shape(shape)})"
        )
    return np.fromiter(items, dtype=object, count=count).reshape(shape)


def array_to_bytes(
    array: Array, datatype: DataType, *, tensor: str = "output"
) -> bytes | memoryview:
    """Row-major little-endian bytes: a memoryview of the array itself when it is large
    and contiguous; a copy when small, as ``tobytes()`` is 4x cheaper than the view then."""
    if datatype.wire == "BYTES":
        return _pack_bytes(array)
    native = _native(array, datatype, tensor)
    return native.tobytes() if native.nbytes < COPY_BELOW else native.data.cast("B")


def _pack_bytes(array: Array) -> bytes:
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=object).reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += (_PREFIX.pack(len(data)), data)
    return b"".join(parts)


def _native(array: Array, datatype: DataType, tensor: str) -> Array:
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
        arr = arr.astype(_LITTLE_ENDIAN[datatype.wire])
    return arr


def array_from_json(
    data: object, datatype: DataType, shape: tuple[int, ...], *, tensor: str
) -> Array:
    """The JSON ``data`` field (flat or nested row-major) as an array of ``shape``."""
    if datatype.wire == "BF16":
        raise InvalidArgument(
            f"tensor '{tensor}': BF16 cannot be sent as JSON numbers; send it as binary data "
            "(the binary_data_size parameter)"
        )
    flat, kinds = _flatten(data, tensor)
    count = math.prod(shape)
    if len(flat) != count:
        raise InvalidArgument(
            (_TOO_MANY if len(flat) > count else _TOO_FEW)
            + f" (batchserve: tensor '{tensor}': data has {len(flat)} elements, shape "
            f"{format_shape(shape)} needs {count})"
        )
    _check_json_types(flat, kinds, datatype, tensor)
    if datatype.wire == "BYTES":
        flat = [item.encode() for item in flat]
    return array_from_values(flat, datatype, shape, tensor=tensor)


def _flatten(data: object, tensor: str) -> tuple[list[Any], set[type]]:
    """The values in depth-first order and their types. Regular nesting is opened one level
    at a time (fast, no recursion); a level mixing arrays and values, as Triton also reads,
    goes depth-first from there, so that no value is walked more than once."""
    if type(data) is not list:
        raise InvalidArgument(f"tensor '{tensor}': data must be an array, got {describe(data)}")
    flat, depth = data, 1
    while list in (kinds := set(map(type, flat))):
        if len(kinds) > 1:
            flat = _depth_first(flat, depth, tensor)
            return flat, set(map(type, flat))
        depth += 1
        _check_depth(depth, tensor)
        flat = list(chain.from_iterable(flat))
    return flat, kinds


def _depth_first(items: list[Any], depth: int, tensor: str) -> list[Any]:
    """The values under ``items`` (found ``depth`` levels down), with an explicit stack."""
    values: list[Any] = []
    stack = [(iter(items), depth)]
    while stack:
        level, at = stack[-1]
        for item in level:
            if type(item) is list:
                _check_depth(at + 1, tensor)
                stack.append((iter(item), at + 1))
                break
            values.append(item)
        else:
            stack.pop()
    return values


def _check_depth(depth: int, tensor: str) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgument(
            f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}) "
            f"(batchserve: tensor '{tensor}': data is nested deeper than {MAX_JSON_DEPTH} levels)"
        )


def _check_json_types(flat: list[Any], kinds: set[type], datatype: DataType, tensor: str) -> None:
    allowed, expected = _JSON_KINDS[datatype.wire]
    wrong = kinds - allowed
    if wrong:
        bad = next(item for item in flat if type(item) in wrong)
        raise InvalidArgument(
            f"tensor '{tensor}': {datatype.wire} data must be {expected}, got {describe(bad)}"
        )


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


def array_to_json(array: Array, datatype: DataType, *, tensor: str = "output") -> list[Any] | Array:
    """Row-major flat JSON data: a list of str for BYTES, else a 1-D array that
    ``orjson.dumps(..., option=JSON_OPTIONS)`` writes twice as fast as a ``tolist()``."""
    if datatype.wire == "BYTES":
        return _strings(array, tensor)
    flat = _native(array, datatype, tensor).reshape(-1)
    if datatype.wire == "BF16":
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        raise NotJsonRepresentable(
            f"tensor '{tensor}': {datatype.wire} data holds NaN or infinity, which JSON cannot "
            "carry; request it as binary data"
        )
    # BF16 as float64, so that the shortest decimal orjson writes is the exact value
    return flat.astype(np.float64) if datatype.wire == "BF16" else flat


def _strings(array: Array, tensor: str) -> list[str]:
    items = np.asarray(array, dtype=object).reshape(-1)
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
    except UnicodeDecodeError:
        raise NotJsonRepresentable(
            f"tensor '{tensor}': BYTES data is not UTF-8 and cannot be sent as JSON; "
            "request it as binary data"
        ) from None


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


def request_options(parameters: Mapping[str, object]) -> RequestOptions:
    """Split priority, timeout and binary_data_output from the other request parameters."""
    if not parameters:
        return RequestOptions(0, 0, False, {})
    rest = dict(parameters)
    rest.pop(_EMPTY_FINAL_RESPONSE, None)  # streams answer one response a request anyway
    reserved = next((key for key in rest if key.startswith("triton_")), None)
    if reserved is not None:
        raise InvalidArgument(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            f"not be specified. (batchserve: request parameter {reserved[:64]!r})"
        )
    for key in _SEQUENCE_KEYS:
        if key in rest:
            raise InvalidArgument(f"request parameter '{key}': sequence batching is not supported")
    priority = _unsigned(rest.pop("priority", 0), "priority")
    timeout = _unsigned(rest.pop("timeout", 0), "timeout")
    binary = rest.pop("binary_data_output", False)
    if type(binary) is not bool:
        raise InvalidArgument(
            f"request parameter 'binary_data_output' must be true or false, got {describe(binary)}"
        )
    return RequestOptions(priority, timeout, binary, rest)


def _unsigned(value: object, key: str) -> int:
    if type(value) is not int or not 0 <= value < 2**64:
        raise InvalidArgument(
            f"request parameter '{key}' must be an integer >= 0, got {describe(value)}"
        )
    return value
