"""CPU time and machine facts read from /proc, as the benchmark uses them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.procstat import (
    busy_fraction,
    command_name,
    cpu_model,
    cpu_seconds,
    cpu_ticks,
    descendants,
    mem_total_bytes,
    parse_stat,
    tree_ticks,
)

# /proc/<pid>/stat of a process whose name holds a space and a ')'.
STAT = (
    "4242 (odd) name) S 17 4242 4242 0 -1 4194560 2056 0 0 0 "
    "150 25 0 0 20 0 9 0 123456 1000000 500 18446744073709551615"
)


def test_parse_stat_counts_fields_after_the_last_parenthesis() -> None:
    assert parse_stat(STAT) == (17, 175)


def test_tree_ticks_adds_descendants_only() -> None:
    stats = {10: (1, 100), 11: (10, 20), 12: (10, 3), 13: (11, 4), 20: (1, 999)}
    assert tree_ticks(stats, 10) == 127
    assert tree_ticks(stats, 11) == 24


def test_tree_ticks_of_a_vanished_root_is_zero() -> None:
    assert tree_ticks({1: (0, 5)}, 99) == 0


def test_descendants_reach_grandchildren_and_names_come_from_comm(tmp_path: Path) -> None:
    tree = {10: (1, "server"), 11: (10, "bs-fork-server"), 12: (11, "bs-worker-0"),
            13: (11, "bs-worker-1"), 20: (1, "other")}  # fmt: skip
    for pid, (parent, name) in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(
            STAT.replace("4242 (odd) name) S 17", f"{pid} ({name}) S {parent}")
        )
        (tmp_path / str(pid) / "comm").write_text(f"{name}\n")
    (tmp_path / "self").mkdir()

    assert sorted(descendants(10, tmp_path)) == [11, 12, 13]
    assert descendants(12, tmp_path) == []
    assert [command_name(pid, tmp_path) for pid in (11, 12)] == ["bs-fork-server", "bs-worker-0"]
    assert command_name(99, tmp_path) == ""


def test_cpu_seconds_grows_with_work_done() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.1


def test_cpu_model_and_memory_from_proc_text() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\n"
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R)"
    assert cpu_model("processor\t: 0\n") == "unknown"
    assert mem_total_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 24576000 * 1024
    with pytest.raises(ValueError, match="MemTotal"):
        mem_total_bytes("MemFree: 1 kB\n")


def test_cpu_ticks_count_idle_and_iowait_as_not_busy() -> None:
    stat = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\n"
    assert cpu_ticks(stat) == (160, 1000)


def test_busy_fraction_is_a_share() -> None:
    assert 0.0 <= busy_fraction(0.05) <= 1.0
