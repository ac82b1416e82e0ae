"""glibc's allocator set so that loading and unloading models does not ratchet up RSS.

Each model instance loads on a thread of its own, and glibc gives new threads their own
arenas (up to 8 per core). Unloading frees what ONNX Runtime allocated there, but glibc
keeps the free memory at the top of every arena's heap below its trim threshold, which
grows with the largest block freed (up to 64 MiB); ``malloc_trim`` releases the free pages
inside every arena, but the top of the main one only. With 8 threads racing loads and
unloads of one small model, RSS went from 132 MB to 160-300 MB with the model unloaded;
the memory in use stayed at 27 MB and the Python objects did not grow (``mallinfo2``,
``gc``): free memory held, not a leak. One arena and a trim after each change of the
loaded models kept it at 133 MB over 10 rounds (two arenas: 149-171 MB; either alone did
not bound it). One arena costs little here: most allocations happen under the GIL anyway,
and ONNX Runtime serves tensors from its own arena (no throughput change measured on
digits_cnn). Fixing the mmap and trim thresholds instead also bounds RSS, but makes every
request buffer above them a fresh mapping (0.5-2 MiB buffers took 13-37 times longer to
allocate and fill on a 2-core VM).

``MALLOC_ARENA_MAX`` set in the environment wins (glibc reads it at start), and on other
C libraries (musl, macOS) both calls do nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import time
from functools import cache

logger = logging.getLogger(__name__)

ARENA_MAX = 1
"""Arenas for the whole process: every thread shares the main one, which a trim empties."""
_M_ARENA_MAX = -8  # glibc's malloc.h


@cache
def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def limit_arenas(arena_max: int = ARENA_MAX) -> None:
    """Cap glibc's arenas; call before the threads that load models exist."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return
    if not libc.mallopt(_M_ARENA_MAX, arena_max):
        logger.warning("mallopt(M_ARENA_MAX) refused", extra={"arena_max": arena_max})


def trim() -> None:
    """Give the free pages in the heap back to the system (after an unload or a reload)."""
    libc = _glibc()
    if libc is None:
        return
    started = time.perf_counter()
    libc.malloc_trim(0)
    logger.debug("heap trimmed", extra={"trim_ms": round((time.perf_counter() - started) * 1e3, 1)})
