"""The host's CPU use and memory, read from ``/proc`` as Triton's CPU metrics read them.

Utilisation is the share of CPU time the whole machine spent busy (user, nice, system, irq,
softirq and steal against those plus idle and iowait) between two readings: each scrape
reads it since the one before (the first since boot). Used memory is ``MemTotal`` less
``MemAvailable``. Elsewhere than Linux there is no ``/proc`` and no reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal, in /proc/stat's order
_IDLE = (3, 4)  # idle iowait


@dataclass(frozen=True, slots=True)
class HostReading:
    """The machine at one scrape."""

    cpu_utilization_ratio: float
    memory_total_bytes: int
    memory_used_bytes: int


class HostUsage:
    """Reads the machine's CPU time and memory; keeps the last CPU times to take the next
    reading's difference from."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._stat = proc / "stat"
        self._meminfo = proc / "meminfo"
        self._last = (0, 0)

    def read(self) -> HostReading | None:
        """The reading, or None where ``/proc`` is missing or unreadable."""
        try:
            busy, idle = _cpu_times(self._stat.read_text())
            total, available = _memory(self._meminfo.read_text())
        except (OSError, ValueError, IndexError, KeyError):
            return None
        last_busy, last_idle = self._last
        self._last = (busy, idle)
        elapsed = (busy - last_busy) + (idle - last_idle)
        ratio = (busy - last_busy) / elapsed if elapsed > 0 else 0.0
        return HostReading(ratio, total, total - available)


def _cpu_times(stat: str) -> tuple[int, int]:
    """Busy and idle ticks of all CPUs together (the ``cpu`` line)."""
    first = stat.split("\n", 1)[0].split()
    if first[0] != "cpu":
        raise ValueError("no aggregate cpu line")
    ticks = [int(value) for value in first[1:9]]
    return sum(ticks[i] for i in _BUSY), sum(ticks[i] for i in _IDLE)


def _memory(meminfo: str) -> tuple[int, int]:
    """``MemTotal`` and ``MemAvailable`` in bytes (the file counts kibibytes)."""
    fields = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024 if rest.split() else 0
    return fields["MemTotal"], fields["MemAvailable"]
