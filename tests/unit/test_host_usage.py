"""The host's CPU use between scrapes and its memory, from files laid out as Linux's /proc."""

from __future__ import annotations

from pathlib import Path

import pytest
from batchserve.devices.host import HostUsage
from batchserve.runtime.triton_metrics import host_families

MEMINFO = "MemTotal:       24683656 kB\nMemFree:        21488244 kB\nMemAvailable:   20683656 kB\n"


def _stat(user: int, nice: int, system: int, idle: int, iowait: int, irq: int, soft: int,
          steal: int) -> str:  # fmt: skip
    per_cpu = "cpu0 1 2 3 4 5 6 7 8 0 0\n"
    return f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {soft} {steal} 0 0\n{per_cpu}"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "stat").write_text(_stat(100, 0, 50, 800, 50, 0, 0, 0))
    return tmp_path


def test_utilization_is_the_busy_share_since_the_previous_reading(proc: Path) -> None:
    host = HostUsage(proc)
    first = host.read()
    assert first is not None
    assert first.cpu_utilization_ratio == pytest.approx(150 / 1000)  # since boot
    # 300 ticks later: user +120, system +30, irq +5, softirq +5, steal +10 busy; idle +100,
    # iowait +30 not
    (proc / "stat").write_text(_stat(220, 0, 80, 900, 80, 5, 5, 10))
    second = host.read()
    assert second is not None
    assert second.cpu_utilization_ratio == pytest.approx(170 / 300)
    third = host.read()  # no tick since: nothing to divide
    assert third is not None
    assert third.cpu_utilization_ratio == 0


def test_memory_used_is_total_less_available(proc: Path) -> None:
    reading = HostUsage(proc).read()
    assert reading is not None
    assert reading.memory_total_bytes == 24683656 * 1024
    assert reading.memory_used_bytes == (24683656 - 20683656) * 1024
    names = [family.name for family in host_families(reading)]
    assert names == ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"]


def test_without_proc_there_is_no_reading_and_no_family(tmp_path: Path) -> None:
    assert HostUsage(tmp_path / "absent").read() is None
    (tmp_path / "stat").write_text("intr 1 2 3\n")  # no aggregate cpu line
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert HostUsage(tmp_path).read() is None
    assert list(host_families(None)) == []


def test_this_machine_reads(tmp_path: Path) -> None:
    if not Path("/proc/stat").is_file():
        pytest.skip("no /proc here")
    reading = HostUsage().read()
    assert reading is not None
    assert 0 <= reading.cpu_utilization_ratio <= 1
    assert 0 < reading.memory_used_bytes < reading.memory_total_bytes
