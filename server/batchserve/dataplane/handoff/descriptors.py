"""A request's (or a response's) tensors laid out in one arena block, and read back.

Each tensor is described by ``(name, wire datatype, shape, start, nbytes)``, ``start``
counted from the block. A block the arena cannot hold goes inline in the frame instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.tensors import array_from_bytes, array_to_bytes
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.ring import ALIGNMENT

Descriptor = tuple[str, str, tuple[int, ...], int, int]
INLINE = -1
"""The block offset of tensors sent inside the frame."""


def place(
    tensors: Sequence[tuple[str, DataType, np.ndarray]], arena: Arena
) -> tuple[int, bytes, list[Descriptor]]:
    """Copy ``tensors`` into one new block: (block offset or INLINE, inline bytes,
    descriptors). The caller frees the block once the other side has answered."""
    packed: list[bytes | memoryview | None] = []
    sizes: list[int] = []
    total = 0
    for _, datatype, array in tensors:
        if datatype.itemsize:
            data, size = None, array.size * datatype.itemsize
        else:  # BYTES: length-prefixed elements, sized once serialised
            data = array_to_bytes(array, datatype)
            size = len(data)
        packed.append(data)
        sizes.append(size)
        total += (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    block = arena.ring.allocate(total) if total else None
    if block is None:
        return _inline(tensors, packed, sizes)
    descriptors: list[Descriptor] = []
    start = 0
    view = arena.view
    for (name, datatype, array), data, size in zip(tensors, packed, sizes, strict=True):
        if data is None:
            arena.write(block + start, array, datatype)
        else:
            view[block + start : block + start + size] = data
        descriptors.append((name, datatype.wire, array.shape, start, size))
        start += (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    return block, b"", descriptors


def _inline(
    tensors: Sequence[tuple[str, DataType, np.ndarray]],
    packed: list[bytes | memoryview | None],
    sizes: list[int],
) -> tuple[int, bytes, list[Descriptor]]:
    """The tensors inside the frame: the arena had no room for them."""
    parts: list[bytes | memoryview] = []
    descriptors: list[Descriptor] = []
    start = 0
    for (name, datatype, array), data, size in zip(tensors, packed, sizes, strict=True):
        parts.append(data if data is not None else array_to_bytes(array, datatype))
        descriptors.append((name, datatype.wire, array.shape, start, size))
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


def place_rows(
    tensors: Sequence[tuple[str, DataType, tuple[int, ...]]],
    parts: Sequence[dict[str, np.ndarray]],
    arena: Arena,
) -> tuple[int, bytes, list[Descriptor]]:
    """Fixed-size tensors of ``shape`` made of ``parts`` stacked on the batch axis, written
    once, straight into one block (or inline when the arena has no room)."""
    sizes = [math.prod(shape) * datatype.itemsize for _, datatype, shape in tensors]
    total = sum((size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT for size in sizes)
    block = arena.ring.allocate(total) if total else None
    descriptors: list[Descriptor] = []
    if block is None:
        chunks = [np.concatenate([part[name] for part in parts]) for name, _, _ in tensors]
        start = 0
        for (name, datatype, shape), size in zip(tensors, sizes, strict=True):
            descriptors.append((name, datatype.wire, shape, start, size))
            start += size
        data = b"".join(array_to_bytes(c, d) for c, (_, d, _) in zip(chunks, tensors, strict=True))
        return INLINE, data, descriptors
    start = 0
    for (name, datatype, shape), size in zip(tensors, sizes, strict=True):
        row = size // shape[0] if shape[0] else 0
        offset = block + start
        for part in parts:
            array = part[name]
            arena.write(offset, array, datatype)
            offset += array.shape[0] * row
        descriptors.append((name, datatype.wire, shape, start, size))
        start += (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    return block, b"", descriptors
