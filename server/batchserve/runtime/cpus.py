"""How many cores the server may use, and how many request-handling workers that makes.

A container sees every core of its host in ``os.cpu_count()``; what it may actually use is
bounded twice: by its CPU affinity (cpusets, ``taskset``) and by its cgroup's CPU quota (the
Kubernetes CPU limit, ``docker run --cpus``). Sizing the workers from the host's core count
would start processes that only compete for the same quota, so the count comes from the
smaller of the two. Kubernetes can also say it outright: the manifests pass the container's
CPU request (the downward API, rounded up to whole cores) as the ``override``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

FILESYSTEM_ROOT = Path("/")
"""Where /proc and /sys are found; tests point it at a fake tree."""
CGROUP_V2_MOUNT = "sys/fs/cgroup"
CGROUP_V1_CPU_MOUNTS = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu")
"""Where distributions mount the v1 cpu controller: joined with cpuacct, or alone."""
MAX_AUTO_WORKERS = 8


def available_cpus(override: int | None = None, root: Path = FILESYSTEM_ROOT) -> int:
    """``override`` when given; else the cores this process may run on, bounded by its
    cgroup's CPU quota rounded up (a quota of 1.5 cores still keeps two cores busy)."""
    if override is not None:
        if override < 1:
            raise ValueError(f"the number of CPUs must be at least 1, not {override}")
        return override
    cpus = _affinity_cpus()
    limit = cgroup_cpu_limit(root)
    return cpus if limit is None else min(cpus, limit)


def auto_workers(cpus: int) -> int:
    """The ``auto`` number of request-handling workers for ``cpus`` cores.

    One core is left to the model-owning process, which batches requests and runs CPU
    models or feeds the GPU. On two cores two workers lost to one process at most points
    (0.42-1.24 of its throughput, ``bench/NOTES.md``, tenth round), so two cores or fewer
    get one. The count stops at 8: measured on two cores, the model-owning process spent
    17-45 µs a request over HTTP at c=64 and a worker 67-150 µs, so a handful of workers
    keep it busy and more would only wait on it (over gRPC both cost more: 130-180 and
    210-450 µs). On a 16-core host (digits_cnn, 32 clients a worker, ``bench/GPU_RESULTS.md``)
    eight workers served the most of 1, 2, 4 and 8: 2.6x one process over HTTP and 4.2x over
    gRPC, against 2.2x and 2.9x with four.
    """
    if cpus <= 2:
        return 1
    return min(cpus - 1, MAX_AUTO_WORKERS)


def resolve_workers(setting: str | int, cpus: int) -> int:
    """The worker count a ``--workers`` value asks for: ``auto`` (sized from ``cpus``) or a
    positive number, as an int or its text."""
    if setting == "auto":
        return auto_workers(cpus)
    workers = int(setting) if isinstance(setting, int) or setting.isdecimal() else 0
    if workers < 1:
        raise ValueError(f"workers must be 'auto' or a positive number, not {setting!r}")
    return workers


def cgroup_cpu_limit(root: Path = FILESYSTEM_ROOT) -> int | None:
    """Whole cores the CPU quota of this process's cgroup allows, rounded up; None when no
    quota applies or none can be read.

    Every cgroup from the process's own up to the mount's root is read and the smallest
    quota wins, since a parent's quota bounds its children. Without a cgroup namespace,
    /proc/self/cgroup names a path that the container's own mount does not have; then only
    the mount's root files are found, which are the container's. v1 and v2 are both read:
    a file that is missing, unreadable or garbled counts as no quota.
    """
    v2_path, v1_path = _own_cgroups(root / "proc/self/cgroup")
    limits = [
        *(_cpu_max(d / "cpu.max") for d in _ancestors(root / CGROUP_V2_MOUNT, v2_path)),
        *(
            _cfs_quota(d)
            for mount in CGROUP_V1_CPU_MOUNTS
            for d in _ancestors(root / mount, v1_path)
        ),
    ]
    found = [limit for limit in limits if limit is not None]
    return min(found, default=None)


def _affinity_cpus() -> int:
    """Cores the scheduler may run this process on (all of the host's where the platform
    cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS or Windows
        return os.cpu_count() or 1


def _own_cgroups(proc_cgroup: Path) -> tuple[str, str]:
    """This process's cgroup path in the v2 hierarchy and in the v1 cpu controller's
    (lines ``0::/path`` and ``N:cpu,cpuacct:/path``); ``/`` for any not listed."""
    v2_path = v1_path = "/"
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    return v2_path, v1_path


def _ancestors(mount: Path, cgroup: str) -> list[Path]:
    """The cgroup's directory under ``mount``, then each parent up to ``mount`` itself. A
    path outside this cgroup namespace (``/../...``) has only the mount's root."""
    parts = PurePosixPath(cgroup).parts[1:]
    if ".." in parts:
        parts = ()
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _cpu_max(path: Path) -> int | None:
    """cgroup v2 ``cpu.max``: ``max 100000`` (no quota) or ``<quota> <period>``."""
    fields = (_read(path) or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _cores(fields[0], fields[1])


def _cfs_quota(directory: Path) -> int | None:
    """cgroup v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; a quota of -1 is none."""
    quota = _read(directory / "cpu.cfs_quota_us")
    period = _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _cores(quota, period)


def _cores(quota_text: str, period_text: str) -> int | None:
    """Cores a quota per period allows, rounded up; None for no quota or text that is not
    a pair of positive numbers."""
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return -(-quota // period)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):  # missing, unreadable, or not text
        return None
