"""The seeded random inputs PyTorch and the converted model both run on, and their names in
messages.

Each input is drawn within its declared value range (token ids below the vocabulary size,
say), so a case exercises the model as serving will.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import from_numpy
from batchserve.core.errors import InvalidArgument
from batchserve.export.errors import ExportError
from batchserve.export.image_input import BYTE_RANGE
from batchserve.export.spec import DEFAULT_INT_RANGE, ExportSpec, InputSpec

Array = npt.NDArray[Any]
Arrays = dict[str, Array]
SEED = 0


def trace_inputs(spec: ExportSpec) -> Arrays:
    """The inputs the module is traced with (the same on every call)."""
    return random_inputs(spec, spec.trace_case(), np.random.default_rng(SEED))


def random_inputs(spec: ExportSpec, sizes: Mapping[str, int], rng: np.random.Generator) -> Arrays:
    """Fresh random inputs for one case, within each input's declared value range.

    An image input sent as bytes (``--normalize``) without a declared range gets every byte
    value, 0..255, as serving will.
    """
    image = spec.image_input.input if spec.image_input else None
    return {
        item.name: _random_array(item, sizes, rng, BYTE_RANGE if item.name == image else None)
        for item in spec.inputs
    }


def describe(arrays: Mapping[str, Array]) -> str:
    """``tokens: INT64[3, 7], lengths: INT64[3, 1]``, for messages."""
    return ", ".join(f"{name}: {_wire(a)}{list(a.shape)}" for name, a in arrays.items())


def _wire(array: Array) -> str:
    try:
        return from_numpy(array.dtype).wire
    except InvalidArgument:
        return str(array.dtype)


def _random_array(
    item: InputSpec,
    sizes: Mapping[str, int],
    rng: np.random.Generator,
    int_range: tuple[int, int] | None = None,
) -> Array:
    shape = item.shape(sizes)
    dtype = item.datatype.numpy
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        default = int_range or DEFAULT_INT_RANGE
        low, high = item.value_range.bounds(sizes) if item.value_range else default
        if high < low:
            raise ExportError(
                f"input '{item.name}': value range {item.value_range} is empty at {sizes}"
            )
        return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)
    if item.value_range:
        return rng.uniform(*item.value_range.bounds(sizes), size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)
