"""CPU time, load and machine facts read from /proc (Linux), without extra packages."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

PROC = Path("/proc")


def parse_stat(text: str) -> tuple[int, int]:
    """(parent pid, utime + stime in clock ticks) from one /proc/<pid>/stat line.

    The command name sits in parentheses and may itself hold spaces or ')', so fields
    are counted from the last ')'.
    """
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _stats(proc: Path) -> dict[int, tuple[int, int]]:
    found = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except (OSError, ValueError):
                continue  # the process ended while we looked
    return found


def _tree(stats: dict[int, tuple[int, int]], root: int) -> list[int]:
    """``root`` and all its descendants, from parsed stats by pid."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_ticks(stats: dict[int, tuple[int, int]], root: int) -> int:
    """CPU ticks of ``root`` and all its descendants, from parsed stats by pid."""
    return sum(stats[pid][1] for pid in _tree(stats, root) if pid in stats)


def descendants(root: int, proc: Path = PROC) -> list[int]:
    """The processes below ``root`` now: its children, theirs, and so on."""
    return _tree(_stats(proc), root)[1:]


def command_name(pid: int, proc: Path = PROC) -> str:
    """/proc/PID/comm (what a process named itself); empty once it has gone."""
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def cpu_seconds(root: int, proc: Path = PROC) -> float:
    """User + system CPU seconds of a process and its descendants so far."""
    return tree_ticks(_stats(proc), root) / os.sysconf("SC_CLK_TCK")


def parse_rss(status: str) -> int:
    """VmRSS from /proc/<pid>/status text, in bytes (resident memory, shared pages included)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no VmRSS line: the process has exited or is a zombie")


def rss_bytes(pid: int, proc: Path = PROC) -> int:
    """Resident memory of one process now; OSError or ValueError once it has gone."""
    return parse_rss((proc / str(pid) / "status").read_text())


def load1() -> float:
    return os.getloadavg()[0]


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, total) ticks of all CPUs from /proc/stat text; idle and iowait are not busy."""
    return line_ticks(stat.splitlines()[0].split()[1:])


def line_ticks(values: Sequence[str]) -> tuple[int, int]:
    """(busy, total) ticks of one /proc/stat ``cpu`` line's values; idle and iowait are not
    busy."""
    fields = [int(v) for v in values[:8]]
    total = sum(fields)  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - fields[3] - fields[4], total


def busy_fraction(seconds: float, proc: Path = PROC) -> float:
    """Share of the machine's CPU time that was busy over ``seconds`` (0..1)."""
    busy0, total0 = cpu_ticks((proc / "stat").read_text())
    time.sleep(seconds)
    busy1, total1 = cpu_ticks((proc / "stat").read_text())
    return (busy1 - busy0) / max(1, total1 - total0)


def cpu_model(cpuinfo: str) -> str:
    """The first 'model name' in /proc/cpuinfo text ('unknown' when absent, e.g. on ARM)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def mem_total_bytes(meminfo: str) -> int:
    """MemTotal from /proc/meminfo text, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemTotal line in /proc/meminfo")
