"""A request's (or a response's) tensors laid out in one arena block, and read back.

Each tensor is described by ``(name, wire datatype, shape, start, nbytes)``, ``start``
counted from the block. A block the arena cannot hold goes inline in the frame instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.tensors import array_from_bytes, array_to_bytes
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.ring import aligned

Descriptor = tuple[str, str, tuple[int, ...], int, int]
INLINE = -1
"""The block offset of tensors sent inside the frame."""


def _wire_size(array: np.ndarray, datatype: DataType) -> tuple[int, bytes | memoryview | None]:
    if datatype.itemsize == 0:
        data = array_to_bytes(array, datatype)
        return len(data), data
    return array.size * datatype.itemsize, None


def place(
    tensors: Sequence[tuple[str, DataType, np.ndarray]], arena: Arena
) -> tuple[int, bytes, list[Descriptor]]:
    """Copy ``tensors`` into one new block: (block offset or INLINE, inline bytes,
    descriptors). The caller frees the block once the other side has answered."""
    sizes = [_wire_size(array, datatype) for _, datatype, array in tensors]
    total = sum(aligned(size) for size, _ in sizes)
    block = arena.ring.allocate(total) if total else None
    descriptors: list[Descriptor] = []
    start = 0
    if block is not None:
        view = arena.view
        for (name, datatype, array), (size, packed) in zip(tensors, sizes, strict=True):
            if packed is None:
                arena.write(block + start, array, datatype)
            else:
                view[block + start : block + start + size] = packed
            descriptors.append((name, datatype.wire, tuple(array.shape), start, size))
            start += aligned(size)
        return block, b"", descriptors
    parts: list[bytes | memoryview] = []
    for (name, datatype, array), (size, packed) in zip(tensors, sizes, strict=True):
        data = packed if packed is not None else array_to_bytes(array, datatype)
        parts.append(data)
        descriptors.append((name, datatype.wire, tuple(array.shape), start, size))
        start += size
    return INLINE, b"".join(parts), descriptors


def read(arena: Arena, block: int, inline: bytes, descriptor: Descriptor) -> np.ndarray:
    """One tensor: a view into the arena (or the frame), BYTES parsed into elements."""
    name, wire, shape, start, size = descriptor
    datatype = BY_WIRE[wire]
    if block == INLINE:
        buffer = memoryview(inline)[start : start + size]
        return array_from_bytes(buffer, datatype, tuple(shape), tensor=name)
    return arena.read(block + start, size, datatype, tuple(shape), name)
