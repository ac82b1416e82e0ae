"""One worker's shared memory, mapped by both processes: an anonymous file (``memfd``), so
its size is bounded by the pod's memory and not by the 64 MiB ``/dev/shm`` a container gets.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Callable

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.tensors import LITTLE_ENDIAN, array_from_bytes, array_to_bytes
from batchserve.dataplane.handoff.ring import Ring

Release = Callable[[int], None]
CONTROL_BYTES = 64
"""The arena's last cache line, kept out of its ring: words both processes read and write
in place, without a frame (``read_mark``)."""


class Arena:
    """A mapped memfd with a ring allocator, used by the one process that allocates in it."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.view = memoryview(self.map)
        self.ring = Ring(size - CONTROL_BYTES)
        self.control = self.view[size - CONTROL_BYTES :].cast("Q")
        """The control line as eight unsigned 64-bit words, zero in a new arena."""
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self._idle_references = sys.getrefcount(self.map)

    @classmethod
    def create(cls, name: str, size: int) -> Arena:
        """A new arena; its descriptor is inheritable so a spawned worker can map it."""
        fd = os.memfd_create(name, 0)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close_descriptor(self) -> None:
        """Close the memfd; the mapping lives on until the arena is dropped."""
        os.close(self.fd)
        self.fd = -1

    def release_memory(self) -> None:
        """Return the arena's pages (shared memory, in the pod's account) while it stays
        mapped: an array still viewing it reads zeros from then on, never unmapped memory.
        For a worker that is gone, whose answers nobody waits for."""
        self.map.madvise(mmap.MADV_REMOVE)

    def close(self) -> bool:
        """Unmap the arena; False, and still mapped, while an array views it (retry later).
        numpy keeps no buffer export of what it views, only a reference to the mapping
        (its ``base``), so the references are what tell."""
        if sys.getrefcount(self.map) > self._idle_references:
            return False
        try:
            self.control.release()
            self.view.release()
            self.map.close()
        except BufferError:  # a memoryview of it is still held
            return False
        return True

    def write(self, offset: int, array: np.ndarray, datatype: DataType) -> int:
        """Copy ``array``'s wire bytes to ``offset``; the bytes written."""
        if datatype.itemsize == 0:  # BYTES: length-prefixed elements
            data = array_to_bytes(array, datatype)
            self.view[offset : offset + len(data)] = data
            return len(data)
        target = np.ndarray(array.shape, LITTLE_ENDIAN[datatype.wire], self.view, offset)
        np.copyto(target, array, casting="same_kind")
        return target.nbytes

    def read(
        self, offset: int, nbytes: int, datatype: DataType, shape: tuple[int, ...], tensor: str
    ) -> np.ndarray:
        """The tensor at ``offset``: a view into the arena (BYTES: parsed elements)."""
        return array_from_bytes(self.view[offset : offset + nbytes], datatype, shape, tensor=tensor)

    def leased(
        self, offset: int, datatype: DataType, shape: tuple[int, ...], release: Release
    ) -> np.ndarray:
        """A view of a fixed-size tensor that calls ``release(offset)`` once no array uses
        it any more, however many views were taken of it meanwhile."""
        typestr = LITTLE_ENDIAN[datatype.wire].str
        return np.asarray(_Lease(self._address + offset, typestr, shape, offset, release))


class _Lease:
    """The owner numpy records as a view's base: views of views keep it, and it goes
    (returning its block) when the last of them does."""

    __slots__ = ("__array_interface__", "_offset", "_release")

    def __init__(
        self, address: int, typestr: str, shape: tuple[int, ...], offset: int, release: Release
    ) -> None:
        self.__array_interface__ = {
            "data": (address, False),
            "typestr": typestr,
            "shape": shape,
            "version": 3,
        }
        self._offset = offset
        self._release = release

    def __del__(self) -> None:
        self._release(self._offset)
