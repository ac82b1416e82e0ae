"""Rounds of a memory bench: one server per round on a bounded or a raised copy of a model,
the same requests each time, and the resident memory and time they took
(``bench.long_sequences``, ``bench.large_images``)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import machine
from bench.common import ROOT, start_server, stop_server

SETTINGS = ("bounded", "raised")


@dataclass(frozen=True)
class Round:
    setting: str
    seconds: float
    loaded_mib: float
    """Resident memory once the model was loaded."""
    peak_mib: float
    """High-water mark of the resident memory after the requests."""


def memory_mib(pid: int, field: str) -> float:
    """``VmRSS`` or ``VmHWM`` of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"/proc/{pid}/status has no {field}")


def serve_round(
    setting: str, repo: Path, send: Callable[[str], None], port: str = "grpc_port"
) -> Round:
    """Serve ``repo`` from one process, ``send`` every request to its address (the gRPC
    port's, or ``port``'s), and measure."""
    process, ports = start_server(repo, ("--log-format", "json", "--workers", "1"))
    try:
        loaded = memory_mib(process.pid, "VmRSS")
        started = time.perf_counter()
        send(f"127.0.0.1:{ports[port]}")
        seconds = time.perf_counter() - started
        peak = memory_mib(process.pid, "VmHWM")
    finally:
        stop_server(process)
    return Round(setting, seconds, loaded, peak)


def taking_turns(rounds: int) -> list[str]:
    """The settings of each round in order: the two alternate which goes first."""
    return [setting for index in range(rounds)
            for setting in (SETTINGS if index % 2 == 0 else SETTINGS[::-1])]  # fmt: skip


def rounds_table(rounds: list[Round]) -> list[str]:
    """Every round's row, then the medians of each setting, as report lines."""
    lines = [
        "| round | setting | seconds | loaded (MiB) | peak (MiB) |",
        "|---:|---|---:|---:|---:|",
    ]
    for index, one in enumerate(rounds, start=1):
        lines.append(f"| {index} | {one.setting} | {one.seconds:.2f} | {one.loaded_mib:,.0f} | "
                     f"{one.peak_mib:,.0f} |")  # fmt: skip
    medians = {}
    for setting in SETTINGS:
        own = [r for r in rounds if r.setting == setting]
        medians[setting] = (statistics.median(r.seconds for r in own),
                            statistics.median(r.peak_mib - r.loaded_mib for r in own))  # fmt: skip
    lines += [
        "",
        f"Median over the rounds: bounded {medians['bounded'][0]:.2f} s and "
        f"{medians['bounded'][1]:,.0f} MiB above the loaded model at the peak; raised "
        f"{medians['raised'][0]:.2f} s and {medians['raised'][1]:,.0f} MiB; time bounded / "
        f"raised {medians['bounded'][0] / medians['raised'][0]:.2f}.",
    ]
    return lines


def arguments(prog: str, report: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """``--rounds``, ``--concurrency`` and ``--out`` (``bench/<report>`` by default)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each setting")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / report)
    return parser.parse_args(argv)


def report(title: str, workload: Sequence[str], rounds: list[Round]) -> str:
    """The report: the machine, the ``workload``'s lines, what is measured, every round and
    the medians."""
    lines = [f"# {title}", "", *(f"- {line}" for line in machine.describe())]
    lines += [f"- {line}" for line in workload]
    lines += [
        "- loaded: resident memory once the model was loaded; peak: its high-water mark "
        "(`VmHWM`) after the requests",
        "",
        *rounds_table(rounds),
    ]
    return "\n".join(lines) + "\n"
