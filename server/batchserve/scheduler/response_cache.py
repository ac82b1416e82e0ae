"""Triton's response cache (its ``local`` cache, ``--cache-config local,size=N``): the
outputs of requests already answered, served again to a request with the same inputs
without running the model, for the models whose config sets ``response_cache { enable:
true }``.

A request's key hashes (BLAKE2b, 32 bytes) its model and version, each input's name,
datatype, shape and bytes, and the outputs it asks for; the value is a read-only copy of
its outputs. One cache of ``max_bytes`` is shared by every model, the least recently used
entries leaving first, as Triton's local cache does. Stateful steps (sequences) and a
worker's group of requests are never cached.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np

from batchserve.scheduler.work import Arrays

ENTRY_OVERHEAD = 256
"""What an entry costs beside its arrays' bytes (key, dictionaries), counted against the
size as Triton's cache counts its own bookkeeping."""


class ResponseCache:
    """Outputs by request key, within ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[Arrays, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> Arrays | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def insert(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> None:
        """Keep a read-only copy of ``outputs``; one larger than the whole cache is not kept."""
        size = ENTRY_OVERHEAD + sum(_nbytes(array) for array in outputs.values())
        if size > self.max_bytes or key in self._entries:
            return
        kept: Arrays = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            kept[name] = copy
        while self._entries and self.bytes + size > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            self.evictions += 1
        self._entries[key] = (kept, size)
        self.bytes += size


def request_key(model: bytes, inputs: Mapping[str, np.ndarray], outputs: Iterable[str]) -> bytes:
    """The key of a request to ``model`` (its name and version) with these inputs, asking
    for these outputs."""
    digest = hashlib.blake2b(model, digest_size=32)
    for name in sorted(inputs):
        array = inputs[name]
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype == object:
            for item in array.reshape(-1):
                data = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
        else:
            digest.update(np.ascontiguousarray(array).data)
    digest.update(b"\0outputs\0" + "\0".join(outputs).encode())
    return digest.digest()


def _nbytes(array: np.ndarray) -> int:
    if array.dtype != object:
        return int(array.nbytes)
    return sum(len(item) if isinstance(item, bytes) else 64 for item in array.reshape(-1))


def local_cache(size_bytes: int) -> ResponseCache | None:
    """The server's cache of ``--cache-config local,size=N``; None for a size of 0."""
    return ResponseCache(size_bytes) if size_bytes > 0 else None
