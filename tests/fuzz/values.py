"""What a tensor in a request can hold: valid values per datatype and the odd ones clients
(or attackers) send instead, shared by the REST and gRPC request generators."""

from __future__ import annotations

import math
import struct
from functools import cache
from typing import Any, NamedTuple

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from hypothesis import strategies as st

from tests.fuzz.properties import INPUT_NAMES

WIRES = list(BY_WIRE)
ODD_WIRES = ["fp32", "FP8", "STRING", "INT128", "", "FP32 ", "BYTES\x00", "TYPE_FP32"]
NAMES = st.sampled_from([*INPUT_NAMES, "", "X", "x\x00", "é", "名", "x" * 300, " x", "x/../y"])
# Dimensions past every limit: int64's and numpy's (their products wrap), 2**31 (MAX_ELEMENTS).
HUGE_DIMS = [2**31, 2**31 + 1, 2**32, 2**62, 2**63 - 1, 65536]
SMALL_SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)
# Shapes whose every dimension passes on its own but whose products do not, or only just:
# no elements beside dimensions that multiply past what numpy can hold, 2**31 elements
# exactly, one past; and ranks up to the limit.
TRICKY_SHAPES = (
    st.lists(st.sampled_from([0, 0, 1, 2, 3, 255, 65536, 2**31 - 1, 2**31]), max_size=6)
    | st.lists(st.sampled_from([0, 2**31]), min_size=2, max_size=64)
    | st.sampled_from([[1] * 64, [2] * 31, [2] * 32, [2**16, 2**15], [2**16, 2**15 + 1]]).map(
        list  # a copy: mutations change shapes in place
    )
)
MAX_FILLED = 64
"""Tensors of at most this many elements get data to match a new shape."""


class Spec(NamedTuple):
    """A tensor's name, datatype and shape."""

    name: str
    wire: str
    shape: tuple[int, ...]


SPECS = st.builds(Spec, NAMES, st.sampled_from(WIRES), SMALL_SHAPES)
"""A self-consistent tensor description, mostly named like one of the models' inputs."""


def _int_range(wire: str) -> tuple[int, int]:
    info = np.iinfo(BY_WIRE[wire].numpy)
    return int(info.min), int(info.max)


@cache
def scalars(wire: str, *, text: bool) -> st.SearchStrategy[Any]:
    """Valid element values of ``wire`` as Python scalars; BYTES as str when ``text``."""
    if wire == "BOOL":
        return st.booleans()
    if wire == "BYTES":
        return st.text(max_size=6) if text else st.binary(max_size=6)
    if wire in ("FP16", "FP32", "FP64", "BF16"):
        width = {"FP16": 16, "FP32": 32}.get(wire, 64)
        return st.floats(width=width, allow_nan=False, allow_infinity=False)
    low, high = _int_range(wire)
    # Mostly in range; now and then just past it, where casts overflow.
    return st.integers(low, high) | st.sampled_from([low - 1, high + 1])


@cache
def values(wire: str, count: int, *, text: bool) -> st.SearchStrategy[list[Any]]:
    """``count`` valid element values of ``wire`` (BYTES as str when ``text``).

    Numbers come from one draw of random bytes: one draw per element would make
    generating a request cost ten times more than decoding it, and the fuzz run is about
    the request's structure, not its values (odd values come from the mutations).
    """
    if wire == "BYTES":
        return st.lists(scalars(wire, text=text), min_size=count, max_size=count)
    dtype = np.dtype(np.uint8) if wire == "BOOL" else BY_WIRE[wire].numpy
    return _binary(count * dtype.itemsize).map(lambda buf: _elements(buf, wire, dtype))


def _elements(buf: bytes, wire: str, dtype: np.dtype[Any]) -> list[Any]:
    array = np.frombuffer(buf, dtype)
    if wire == "BOOL":
        array = (array & 1).astype(bool)
    elif dtype.kind == "f":
        array = np.where(np.isfinite(array), array, 0)  # JSON has no NaN or infinity
    return array.tolist()


@cache
def _binary(size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size)


def raw_contents(draw: st.DrawFn, wire: str, count: int) -> bytes:
    """The tensor's binary form: little-endian elements, BYTES length-prefixed."""
    if wire == "BYTES":
        items = draw(values(wire, count, text=False))
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return draw(_binary(count * BY_WIRE[wire].itemsize))


def nested(flat: list[Any], shape: tuple[int, ...]) -> list[Any]:
    """``flat`` as row-major nested lists of ``shape`` (the JSON form clients also send)."""
    if len(shape) <= 1:
        return flat
    step = math.prod(shape[1:])
    return [nested(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


ODD_DIMS = st.sampled_from(
    [*HUGE_DIMS, -1, -(2**63), 0, True, False, 1.0, 2.5, "2", None, [], {}]
) | st.integers(-(2**63), 2**63 - 1)
"""Shape entries that are not dimensions, or are absurd ones."""


def zeros(wire: str, count: int, *, text: bool) -> list[Any]:
    """``count`` zero elements as a JSON array or typed contents take them."""
    zero: Any = {"BOOL": False, "BYTES": "" if text else b""}.get(wire, 0)
    if wire in ("FP16", "FP32", "FP64"):
        zero = 0.0
    return [zero] * count


def zero_bytes(wire: str, count: int) -> bytes:
    """``count`` zero elements in binary form (BYTES: empty, each with its length prefix)."""
    return bytes(count * (4 if wire == "BYTES" else BY_WIRE[wire].itemsize))
