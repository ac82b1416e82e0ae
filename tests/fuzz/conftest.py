"""Caps the fuzz run's address space a little above what it uses once everything is
imported: a decoder that allocates far more than its input (a shape whose product
overflows, say) then fails its target with MemoryError instead of swapping the machine."""

from __future__ import annotations

import resource
from pathlib import Path

import tests.fuzz.targets  # noqa: F401 - import everything before measuring

HEADROOM = 2 << 30


def _address_space() -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return None


def pytest_configure() -> None:
    used = _address_space()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if used is not None and soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_AS, (used + HEADROOM, hard))
