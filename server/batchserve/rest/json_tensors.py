"""The JSON ``data`` field of KServe v2 HTTP tensors, to and from arrays.

Protocol choices:

- JSON ``data`` may be flat or nested in any way, as Triton reads it: the values are
  taken in row-major (depth-first) order and only their count must match the shape.
  Nesting is capped at 100 levels (Triton's limit) against hostile bodies. A shape with no
  elements gives an empty tensor whatever ``data`` holds: Triton does not read it then.
- BF16 travels as binary data only, both ways, refused in Triton's words otherwise (numpy
  has no bfloat16 to round JSON numbers into; tritonclient refuses BF16 JSON too). FP16 is
  accepted as JSON numbers: a leniency Triton does not have.
- FP16/FP32 JSON numbers outside the type's range are rejected, not turned into inf.
- BYTES elements are JSON strings (UTF-8). NaN and infinity are read and written as Triton
  does, as the words NaN, Infinity and -Infinity (``json_text``).
- An output JSON cannot carry exactly (BYTES that are not UTF-8) raises
  ``NotJsonRepresentable``; the HTTP codec then sends that output as binary data instead.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Final

import numpy as np
import orjson

from batchserve.core.datatypes import DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import (
    INT64_MAX,
    UINT64_MAX,
    Array,
    array_from_values,
    describe,
    format_shape,
    native_array,
)
from batchserve.rest.json_text import with_non_finite

MAX_JSON_DEPTH: Final = 100  # Triton's limit
JSON_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY  # what array_to_json's arrays need

_SIGNED: Final = (frozenset({int}), "integers", "non-signed-integer as signed-integer")
_UNSIGNED: Final = (frozenset({int}), "integers", "non-unsigned-integer as unsigned-integer")
_NUMBERS: Final = (frozenset({int, float}), "numbers", "non-number as double")
# The exact JSON value types each datatype accepts (bool is not an int here), in our words
# and as Triton's JSON reader (TritonJson) reads them.
_JSON_KINDS: Final[dict[str, tuple[frozenset[type], str, str]]] = {
    **dict.fromkeys(("INT8", "INT16", "INT32", "INT64"), _SIGNED),
    **dict.fromkeys(("UINT8", "UINT16", "UINT32", "UINT64"), _UNSIGNED),
    **dict.fromkeys(("FP16", "FP32", "FP64"), _NUMBERS),
    "BOOL": (frozenset({bool}), "true or false", "non-boolean as boolean"),
    "BYTES": (frozenset({str}), "strings", "non-string as string"),
}
# Triton's two texts for a data count that does not match the shape (http_server.cc)
_TOO_MANY: Final = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_TOO_FEW: Final = "Failed to parse 'data' field: shape does not match true shape"


class NotJsonRepresentable(InvalidArgument):
    """The tensor cannot be written as JSON (BYTES that are not UTF-8, NaN, infinity)."""


def array_from_json(
    data: object, datatype: DataType, shape: tuple[int, ...], *, tensor: str
) -> Array:
    """The JSON ``data`` field (flat or nested row-major) as an array of ``shape``; with no
    elements ``data`` is not read, whatever it holds, as Triton does not read it then."""
    count = math.prod(shape)
    if count == 0:
        return array_from_values([], datatype, shape, tensor=tensor)
    _check_not_bf16(datatype, tensor)
    flat, kinds = _flatten(data, tensor)
    if len(flat) != count:
        raise InvalidArgument(
            (_TOO_MANY if len(flat) > count else _TOO_FEW)
            + f" (batchserve: tensor '{tensor}': data has {len(flat)} elements, shape "
            f"{format_shape(shape)} needs {count})"
        )
    _check_json_types(flat, kinds, datatype, tensor)
    if datatype.wire == "BYTES":
        flat = [item.encode() for item in flat]
    try:
        return array_from_values(flat, datatype, shape, tensor=tensor)
    except InvalidArgument:
        _check_json_integer_range(flat, datatype, tensor)
        raise


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


def _check_not_bf16(datatype: DataType, tensor: str) -> None:
    if datatype.wire == "BF16":
        raise InvalidArgument(
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            f"for input {tensor} (batchserve: tensor '{tensor}': send it with the "
            "binary_data_size parameter)"
        )


def check_json_values(values: list[Any], datatype: DataType, tensor: str) -> None:
    """Every one of ``values`` (a flat list) is a JSON value ``datatype`` takes."""
    _check_not_bf16(datatype, tensor)
    _check_json_types(values, set(map(type, values)), datatype, tensor)


def _check_json_types(flat: list[Any], kinds: set[type], datatype: DataType, tensor: str) -> None:
    wrong = kinds - _JSON_KINDS[datatype.wire][0]
    if wrong:
        raise _json_type_error(next(item for item in flat if type(item) in wrong), datatype, tensor)


def _json_type_error(value: object, datatype: DataType, tensor: str) -> InvalidArgument:
    """A JSON value of the wrong type for ``datatype``: Triton's words (its HTTP front end
    reading the value as that type), then ours."""
    _, expected, reading = _JSON_KINDS[datatype.wire]
    return InvalidArgument(
        f"Unable to parse 'data': attempt to access JSON {reading} (batchserve: tensor "
        f"'{tensor}': {datatype.wire} data must be {expected}, got {describe(value)})"
    )


def _check_json_integer_range(flat: list[Any], datatype: DataType, tensor: str) -> None:
    """An integer Triton's JSON reader cannot read as a 64-bit value of the type's sign (a
    negative UINT, an INT past int64) gets its text; one that fits 64 bits but not the
    narrower type keeps our range text (Triton wraps it silently)."""
    kind = _JSON_KINDS[datatype.wire]
    if kind is not _SIGNED and kind is not _UNSIGNED:
        return
    low, high = (0, UINT64_MAX) if kind is _UNSIGNED else (-INT64_MAX - 1, INT64_MAX)
    value = next((item for item in flat if not low <= item <= high), None)
    if value is not None:
        raise InvalidArgument(
            f"Unable to parse 'data': attempt to access JSON {kind[2]} (batchserve: tensor "
            f"'{tensor}': {value} is out of range for {datatype.wire})"
        )


def array_to_json(
    array: Array, datatype: DataType, *, tensor: str = "output"
) -> list[Any] | Array | orjson.Fragment:
    """Row-major flat JSON data: a list of str for BYTES, else a 1-D array that
    ``orjson.dumps(..., option=JSON_OPTIONS)`` writes twice as fast as a ``tolist()``, or,
    holding NaN or infinity, the JSON text Triton writes for it. BF16 is refused as Triton
    refuses it, failing the request (not ``NotJsonRepresentable``: no switch to binary)."""
    if datatype.wire == "BYTES":
        return _strings(array, tensor)
    if datatype.wire == "BF16":
        raise InvalidArgument(
            "sending BF16 data via JSON is not supported. Please use the binary data format "
            f"for output (batchserve: output '{tensor}': ask for it with the binary_data "
            "parameter)"
        )
    flat = native_array(array, datatype, tensor).reshape(-1)
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        return with_non_finite(flat)
    return flat


def _strings(array: Array, tensor: str) -> list[str]:
    items = np.asarray(array, dtype=object).reshape(-1)
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
    except UnicodeDecodeError:
        raise NotJsonRepresentable(
            f"tensor '{tensor}': BYTES data is not UTF-8 and cannot be sent as JSON; "
            "request it as binary data"
        ) from None
