"""The CPUs this process may use: its affinity, its cgroup's CPU quota, and the physical
cores among them.

A container sees every core of its host in ``os.cpu_count()``; what it may actually use is
bounded twice: by its CPU affinity (cpusets, ``taskset``) and by its cgroup's CPU quota (the
Kubernetes CPU limit, ``docker run --cpus``). The worker count (``runtime/cpus.py``) and the
runtimes' thread pools (``runtime_threads``) are sized from the smaller of the two, not from
the host. Kubernetes can also say it outright: the manifests pass the container's CPU
request (the downward API, rounded up to whole cores) as the ``override``.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path, PurePosixPath

FILESYSTEM_ROOT = Path("/")
"""Where /proc and /sys are found; tests point it at a fake tree."""
CGROUP_V2_MOUNT = "sys/fs/cgroup"
CGROUP_V1_CPU_MOUNTS = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu")
"""Where distributions mount the v1 cpu controller: joined with cpuacct, or alone."""
SYSFS_CPUS = "sys/devices/system/cpu"
"""Where the kernel shows each CPU's topology (``cpuN/topology/thread_siblings_list``)."""


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


_declared: int | None = None
"""The server's ``--cpus``, once it has started (``declare_cpus``)."""


def declare_cpus(cpus: int | None) -> None:
    """Take the server's ``--cpus`` (on Kubernetes the pod's CPU request, which bounds nothing
    where the pod has no CPU limit) as the CPUs this process may use, for the runtimes' pools
    as for the worker count; None: read them (affinity and quota)."""
    global _declared
    _declared = cpus


def runtime_threads(root: Path = FILESYSTEM_ROOT) -> int:
    """Threads for a runtime's pool that its config leaves to the runtime: one per physical
    core this process may run on, at most ``available_cpus`` (the server's ``--cpus`` where
    given).

    ONNX Runtime left to itself takes one thread per physical core of the host and pins each
    to its core, whatever this process may use: under a 1-CPU affinity on the 2-core machine
    its second thread ran on the other core, in a container limited by a cpuset it fails to
    pin ("pthread_setaffinity_np failed ... Specify the number of threads explicitly so the
    affinity is not set"), and under a quota it runs as many threads as the host has cores
    in the time of a few. A count set explicitly is taken as it is and pins nothing."""
    allowed = _affinity_set()
    cores = len(physical_cores(allowed, root)) if allowed else _affinity_cpus()
    return max(1, min(cores, available_cpus(_declared, root)))


def physical_cores(allowed: Collection[int], root: Path = FILESYSTEM_ROOT) -> list[tuple[int, ...]]:
    """The ``allowed`` CPUs grouped by the physical core they share (their hyper-threads, from
    the kernel's topology files), in order of their first CPU; a CPU whose topology the kernel
    does not show is a core of its own."""
    cores: dict[tuple[int, ...], None] = {}
    for cpu in sorted(allowed):
        siblings_file = root / SYSFS_CPUS / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        siblings = parse_cpu_list(_read(siblings_file) or "") or {cpu}
        cores[tuple(sorted((siblings & set(allowed)) | {cpu}))] = None
    return sorted(cores, key=lambda core: core[0])


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel CPU list ("0-3,8,10-11"); empty for text that is not one."""
    found: set[int] = set()
    try:
        for part in text.strip().split(","):
            if part:
                first, _, last = part.partition("-")
                found.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return set()
    return found


def _affinity_set() -> set[int]:
    """The CPUs the scheduler may run this process on (empty where the platform cannot say)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS or Windows
        return set()


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
    return len(_affinity_set()) or os.cpu_count() or 1


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
