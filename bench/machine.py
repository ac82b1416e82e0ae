"""The head of a results file: machine, operating system, versions, date."""

from __future__ import annotations

import os
import platform
import re
import time
from importlib import metadata

from bench import host_speed, procstat
from bench.common import ROOT

PACKAGES = ("onnxruntime", "numpy", "torch", "grpcio", "uvicorn", "uvloop", "httptools",
            "fastapi", "aiohttp", "tritonclient")  # fmt: skip
INSTALLER = ROOT / "scripts" / "install_perf_analyzer.sh"


def describe(gpu: str = "no GPU used", packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """One line each: machine, OS, host speed, Python, packages, perf_analyzer, date."""
    cpu = procstat.cpu_model(_read("/proc/cpuinfo"))
    memory = procstat.mem_total_bytes(_read("/proc/meminfo")) / 2**30
    return [
        f"Machine: {cpu}, {os.cpu_count()} CPUs, {memory:.1f} GiB memory, {gpu}",
        f"OS: {_os_name()}, kernel {platform.release()} ({platform.machine()})",
        str(host_speed.measure()),
        f"Python {platform.python_version()}; " + ", ".join(versions(packages)),
        f"perf_analyzer: {perf_analyzer_origin()}",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    ]


def versions(names: tuple[str, ...]) -> list[str]:
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return found


def perf_analyzer_origin() -> str:
    """perf_analyzer prints no version; the installer pins the wheel it comes from."""
    text = INSTALLER.read_text() if INSTALLER.exists() else ""
    pinned = re.search(r"tritonclient==([\w.]+)", text)
    wheel = f"tritonclient {pinned.group(1)} wheel" if pinned else "unknown wheel"
    return f"C++ binary from the {wheel}, batch 1 per request, binary tensors, sync mode"


def _os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", platform.system())
    except OSError:
        return platform.system()


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""
