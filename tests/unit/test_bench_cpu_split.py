"""The split of a machine's CPUs between a server and its load generator: the split by
physical core, the affinity children start with, and each side's busy share from
/proc/stat."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from batchserve.core.cpu_budget import parse_cpu_list, physical_cores

from bench import cpu_split
from bench.common import running_on


def hyperthreaded_root(root: Path, cores: int) -> Path:
    """A filesystem root whose kernel topology shows ``cores`` physical cores of two threads
    each, numbered as Linux does on x86: CPU i and CPU i + cores share a core."""
    for cpu in range(2 * cores):
        topology = root / "sys/devices/system/cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(f"{cpu % cores},{cpu % cores + cores}\n")
    return root


@pytest.mark.parametrize(
    ("cpus", "text"), [({0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"), ({5}, "5"), (set(), "")]
)
def test_cpu_lists_are_written_as_the_kernel_writes_them(cpus: set[int], text: str) -> None:
    assert cpu_split.format_cpu_list(cpus) == text


def test_a_16_cpu_host_of_8_hyperthreaded_cores_gives_the_load_3_whole_cores(
    tmp_path: Path,
) -> None:
    root = hyperthreaded_root(tmp_path, 8)
    split = cpu_split.split(physical_cores(range(16), root))
    assert split is not None
    assert (split.server_cores, split.load_cores) == (5, 3)
    assert sorted(split.server) == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12]
    assert sorted(split.load) == [5, 6, 7, 13, 14, 15]
    assert split.describe() == (
        "the server on CPUs 0-4,8-12 (5 physical cores), the load generator on CPUs 5-7,13-15 (3)"
    )


@pytest.mark.parametrize(
    ("cores", "server", "load"), [(2, 1, 1), (3, 2, 1), (8, 5, 3), (16, 11, 5), (64, 43, 21)]
)
def test_the_load_gets_a_third_of_the_cores_and_the_server_the_rest(
    cores: int, server: int, load: int
) -> None:
    split = cpu_split.split([(cpu,) for cpu in range(cores)])
    assert split is not None
    assert (split.server_cores, split.load_cores) == (server, load)
    assert f"({server} physical {'core' if server == 1 else 'cores'})," in split.describe()
    assert set(split.server).isdisjoint(split.load)
    assert len(split.server) + len(split.load) == cores


def test_one_core_cannot_be_split() -> None:
    assert cpu_split.split([(0, 1)]) is None
    assert cpu_split.split([]) is None


def _allowed_in_child() -> set[int]:
    """The CPUs a freshly started process may run on, as its kernel status says."""
    status = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/status').read())"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    line = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
    return parse_cpu_list(line.split(":", 1)[1])


def test_a_process_started_inside_running_on_runs_there_and_this_thread_is_restored() -> None:
    before = os.sched_getaffinity(0)
    chosen = {min(before)}
    with running_on(chosen):
        assert _allowed_in_child() == chosen
    assert os.sched_getaffinity(0) == before
    assert _allowed_in_child() == before
    with running_on(()):  # nothing asked: anywhere this thread may run
        assert _allowed_in_child() == before


STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 200 0 50 250 0 0 0 0 0 0
cpu1 100 0 50 350 0 0 0 0 0 0
intr 12345
"""


def test_each_side_s_busy_ticks_come_from_its_own_cpu_lines() -> None:
    assert cpu_split.busy_shares(STAT, [(0,), (1,)]) == [(250, 500), (150, 500)]
    assert cpu_split.busy_shares(STAT, [(0, 1)]) == [(400, 1000)]
    assert cpu_split.busy_shares(STAT, [(7,)]) == [(0, 0)]
