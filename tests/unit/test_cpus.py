"""The cores the server may use (affinity, cgroup v1 and v2 quotas read from fake /proc and
/sys trees, the override) and the ``auto`` number of workers they make."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchserve.core.cpu_budget import (
    available_cpus,
    cgroup_cpu_limit,
    declare_cpus,
    parse_cpu_list,
    physical_cores,
    runtime_threads,
)
from batchserve.runtime.cpus import auto_workers, resolve_workers

POD = "/kubepods/burstable/pod1/container1"
V2 = "sys/fs/cgroup"
V1 = "sys/fs/cgroup/cpu,cpuacct"


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """A filesystem root holding ``files`` (paths relative to it)."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def _v2(root: Path, cpu_max: str | bytes, cgroup: str = POD) -> Path:
    return _tree(root, {"proc/self/cgroup": f"0::{cgroup}\n", f"{V2}{cgroup}/cpu.max": cpu_max})


def _v1(root: Path, quota: str, period: str = "100000", mount: str = V1) -> Path:
    return _tree(
        root,
        {
            "proc/self/cgroup": f"5:memory:{POD}\n3:cpu,cpuacct:{POD}\n1:name=systemd:{POD}\n",
            f"{mount}{POD}/cpu.cfs_quota_us": quota,
            f"{mount}{POD}/cpu.cfs_period_us": period,
        },
    )


def _affinity(monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("150000 100000", 2),
        ("200000 100000", 2),
        ("50000 100000", 1),
        ("400000 50000", 8),
        ("max 100000", None),
        ("", None),
        ("garbage", None),
        ("lots 100000", None),
        ("0 100000", None),
        ("100000 0", None),
        ("100000 100000 extra", None),
        (b"\xff\xfe\x00", None),
    ],
)
def test_cgroup_v2_quota_is_rounded_up_to_whole_cores(
    tmp_path: Path, cpu_max: str | bytes, cores: int | None
) -> None:
    assert cgroup_cpu_limit(_v2(tmp_path, cpu_max)) == cores


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [
        ("150000", "100000", 2),
        ("100000", "100000", 1),
        ("-1", "100000", None),
        ("garbage", "100000", None),
        ("150000", "", None),
    ],
)
def test_cgroup_v1_quota_over_period(
    tmp_path: Path, quota: str, period: str, cores: int | None
) -> None:
    assert cgroup_cpu_limit(_v1(tmp_path, quota, period)) == cores


def test_cgroup_v1_cpu_controller_mounted_alone(tmp_path: Path) -> None:
    root = _v1(tmp_path, "250000", mount="sys/fs/cgroup/cpu")
    assert cgroup_cpu_limit(root) == 3


def test_cgroup_v1_without_a_period_has_no_quota(tmp_path: Path) -> None:
    root = _v1(tmp_path, "150000")
    (root / f"{V1}{POD}/cpu.cfs_period_us").unlink()
    assert cgroup_cpu_limit(root) is None


def test_a_container_without_cgroup_namespace_reads_the_mounts_root(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path; the container's mount has only its own root."""
    root = _tree(tmp_path, {"proc/self/cgroup": f"0::{POD}\n", f"{V2}/cpu.max": "300000 100000"})
    assert cgroup_cpu_limit(root) == 3


def test_a_parents_tighter_quota_bounds_the_process(tmp_path: Path) -> None:
    root = _v2(tmp_path, "800000 100000")
    _tree(root, {f"{V2}/kubepods/burstable/cpu.max": "200000 100000"})
    assert cgroup_cpu_limit(root) == 2


def test_an_unlimited_own_cgroup_still_meets_its_parents_quota(tmp_path: Path) -> None:
    root = _v2(tmp_path, "max 100000")
    _tree(root, {f"{V2}/kubepods/cpu.max": "500000 100000"})
    assert cgroup_cpu_limit(root) == 5


def test_a_path_outside_the_cgroup_namespace_reads_only_the_root(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/../elsewhere\n",
            f"{V2}/elsewhere/cpu.max": "100000 100000",
            f"{V2}/cpu.max": "400000 100000",
        },
    )
    assert cgroup_cpu_limit(root) == 4


def test_without_proc_self_cgroup_the_root_files_are_read(tmp_path: Path) -> None:
    root = _tree(tmp_path, {f"{V2}/cpu.max": "200000 100000"})
    assert cgroup_cpu_limit(root) == 2


def test_nothing_to_read_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None


def test_an_unreadable_file_is_no_quota(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"proc/self/cgroup": f"0::{POD}\n"})
    (root / f"{V2}{POD}/cpu.max").mkdir(parents=True)  # reading a directory fails
    assert cgroup_cpu_limit(root) is None


def test_the_quota_bounds_the_affinity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _affinity(monkeypatch, 16)
    assert available_cpus(root=_v2(tmp_path, "150000 100000")) == 2


def test_the_affinity_bounds_the_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _affinity(monkeypatch, 2)
    assert available_cpus(root=_v2(tmp_path, "600000 100000")) == 2


def test_without_a_quota_the_affinity_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _affinity(monkeypatch, 5)
    assert available_cpus(root=_v2(tmp_path, "max 100000")) == 5


def test_without_affinity_support_the_cpu_count_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cpus(root=tmp_path) == 6
    assert available_cpus(root=_v2(tmp_path, "300000 100000")) == 3


def test_the_override_wins_over_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _affinity(monkeypatch, 2)
    assert available_cpus(6, root=_v2(tmp_path, "100000 100000")) == 6


@pytest.mark.parametrize("override", [0, -1])
def test_an_override_below_one_core_is_refused(override: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        available_cpus(override)


def test_this_machine_has_at_least_one_and_at_most_all_cores() -> None:
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("cpus", "workers"),
    [(1, 1), (2, 1), (3, 2), (4, 3), (8, 7), (9, 8), (16, 8), (64, 8)],
)
def test_auto_leaves_a_core_to_the_model_process_and_stops_at_eight(
    cpus: int, workers: int
) -> None:
    assert auto_workers(cpus) == workers


@pytest.mark.parametrize(("setting", "workers"), [("auto", 3), (5, 5), ("5", 5), (1, 1)])
def test_resolve_workers(setting: str | int, workers: int) -> None:
    assert resolve_workers(setting, cpus=4) == workers


@pytest.mark.parametrize("setting", [0, -2, "0", "-2", "", "many", "Auto", "2.5"])
def test_resolve_workers_refuses_anything_but_auto_or_a_positive_number(
    setting: str | int,
) -> None:
    with pytest.raises(ValueError, match="positive number"):
        resolve_workers(setting, cpus=4)


def _topology(root: Path, siblings: dict[int, str]) -> Path:
    """A root whose kernel topology gives each CPU's thread_siblings_list as written."""
    return _tree(
        root,
        {f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list": f"{text}\n"
         for cpu, text in siblings.items()},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()), ("x-1", set())],
)
def test_kernel_cpu_lists_are_read(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


def test_hyper_threads_of_one_core_group_and_only_allowed_cpus_count(tmp_path: Path) -> None:
    root = _topology(tmp_path, {cpu: f"{cpu % 4},{cpu % 4 + 4}" for cpu in range(8)})
    assert physical_cores(range(8), root) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # a cpuset holding one thread of core 1: that thread alone is the core
    assert physical_cores({0, 4, 5}, root) == [(0, 4), (5,)]
    # a CPU whose topology the kernel does not show is a core of its own
    assert physical_cores({9}, root) == [(9,)]


def test_runtime_threads_are_one_per_physical_core_allowed_within_the_quota(
    tmp_path: Path,
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    no_topology = tmp_path / "plain"
    no_topology.mkdir()
    assert runtime_threads(no_topology) == len(allowed)
    assert runtime_threads(_v2(tmp_path / "quota", "100000 100000")) == 1
    # every allowed CPU a hyper-thread of one core: one thread, as ORT would count them
    together = ",".join(map(str, allowed))
    assert runtime_threads(_topology(tmp_path / "smt", dict.fromkeys(allowed, together))) == 1


def test_the_servers_declared_cpus_bound_the_runtime_pools(tmp_path: Path) -> None:
    """``--cpus`` (a pod's CPU request, where no limit sets a quota) sizes the pools as it
    sizes the workers; without it the process's own CPUs do."""
    no_topology = tmp_path / "plain"
    no_topology.mkdir()
    try:
        declare_cpus(1)
        assert runtime_threads(no_topology) == 1
        declare_cpus(64)  # more than it may run on: the CPUs it has still bound it
        assert runtime_threads(no_topology) == len(os.sched_getaffinity(0))
    finally:
        declare_cpus(None)
    assert runtime_threads(no_topology) == len(os.sched_getaffinity(0))
