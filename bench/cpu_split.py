"""The machine's CPUs split between a server and the load generator that measures it.

A load generator on the server's cores takes CPU the server would otherwise have, so a
measurement of how the server scales with its processes (``--workers``) also measures how
the two share the machine: on the 16-CPU GPU host the workers' CPU per request rose from
118 to 201 µs between 2 and 8 workers over HTTP with perf_analyzer beside them
(``bench/GPU_RESULTS.md``). A node serves clients on other machines; on one host the
nearest thing is to give each side CPUs of its own. The split is by physical core (the
logical CPUs that share one are its hyper-threads), so that the two sides do not meet in a
core's shared execution units either.

Processes are placed by the CPU affinity they start with (``bench.common.running_on``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from batchserve.core.cpu_budget import physical_cores

from bench import procstat

LOAD_SHARE = 1 / 3
"""The share of the physical cores the load generator gets: perf_analyzer spent 130-170 µs
of CPU a request on the 2-core machine, about what a worker spends, but a worker's requests
go through the model-owning process as well, which needs a core of its own."""


def format_cpu_list(cpus: Collection[int]) -> str:
    """``cpus`` as a kernel CPU list, runs joined ("0-3,8")."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class CpuSplit:
    """Which CPUs the server runs on, and which the load generator does."""

    server: tuple[int, ...]
    load: tuple[int, ...]
    server_cores: int
    load_cores: int

    def describe(self) -> str:
        cores = "physical core" if self.server_cores == 1 else "physical cores"
        return (
            f"the server on CPUs {format_cpu_list(self.server)} ({self.server_cores} {cores}), "
            f"the load generator on CPUs {format_cpu_list(self.load)} ({self.load_cores})"
        )


def split(cores: Sequence[tuple[int, ...]], load_share: float = LOAD_SHARE) -> CpuSplit | None:
    """The last ``load_share`` of ``cores`` (at least one) for the load generator, the rest
    for the server; None when there are fewer than two cores to split."""
    if len(cores) < 2:
        return None
    load_count = min(len(cores) - 1, max(1, math.floor(len(cores) * load_share + 0.5)))
    server, load = cores[:-load_count], cores[-load_count:]
    return CpuSplit(
        tuple(cpu for core in server for cpu in core),
        tuple(cpu for core in load for cpu in core),
        len(server),
        len(load),
    )


def machine_split(load_share: float = LOAD_SHARE) -> CpuSplit | None:
    """``split`` of the physical cores this process may run on (``core/cpu_budget.py``
    groups them)."""
    return split(physical_cores(os.sched_getaffinity(0)), load_share)


def busy_shares(stat: str, groups: Sequence[Collection[int]]) -> list[tuple[int, int]]:
    """(busy, total) ticks of each group of CPUs from /proc/stat text (its ``cpuN`` lines);
    idle and iowait are not busy."""
    ticks = [(0, 0)] * len(groups)
    for line in stat.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        cpu = int(name[3:])
        busy, total = procstat.line_ticks(values)
        for index, group in enumerate(groups):
            if cpu in group:
                ticks[index] = (ticks[index][0] + busy, ticks[index][1] + total)
    return ticks
