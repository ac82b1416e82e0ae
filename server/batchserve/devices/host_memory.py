"""How much memory this process may use: the host's, or its cgroup's limit where lower.

The models' CPU budget (``--memory-budget``) and the bound on requests in flight
(``--max-request-memory``) are both shares of it. A container sees the host's memory in
``/proc``; what it may use is its cgroup's limit (v2 ``memory.max``, v1
``memory.limit_in_bytes``), the tightest over its cgroup and their parents.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from batchserve.core.digits import ascii_digits

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_memory_limit(
    root: Path = _CGROUP_ROOT, membership: Path = _CGROUP_MEMBERSHIP
) -> int | None:
    """The tightest memory limit over this process's cgroups and their parents (v2 or v1);
    None where there is none or none is readable."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    limits = [_read_limit(path) for path in _limit_files(root, lines)]
    return min((limit for limit in limits if limit is not None), default=None)


def _limit_files(root: Path, membership: Sequence[str]) -> list[Path]:
    files = [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    for line in membership:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = PurePosixPath(path).parts[1:]
        files += [base.joinpath(*parts[:depth]) / name for depth in range(1, len(parts) + 1)]
    return files


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if ascii_digits(text) else None  # v2 writes "max" for no limit


def cpu_total_bytes() -> int:
    """Physical memory, or the cgroup limit where lower (v1 writes ~2**63 for none)."""
    physical = physical_memory_bytes()
    return min(physical, cgroup_memory_limit() or physical)
