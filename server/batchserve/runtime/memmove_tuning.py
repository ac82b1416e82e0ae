"""glibc's ``memmove`` kept off REP MOVSB on AMD CPUs: ``serve`` re-executes itself once.

Every request's tensor bytes are copied on their way to a batch: grpc core joins the
message into bytes (twice), and the batch is assembled from the requests. On AMD CPUs glibc
copies blocks from 2 KiB up to the size of the L2 cache with REP MOVSB, which AMD's Zen cores
run about 10x slower for some placements of source and destination: here, a destination
8-24 bytes past the source modulo 4 KiB. On the AMD EPYC VM the benchmarks run on (Debian
12, glibc 2.36, 512 KiB of L2), a 432 KiB block took 19 us to copy, or 244 us when so
placed, and a 64 KiB one 3 or 38 us. Which copies are so placed depends on where the
allocator put each buffer, so some requests and some runs paid it and others did not. With
REP MOVSB off, glibc copies with vector loops, at 17-20 us and 3 us for those blocks wherever
they lie; a server whose requests carry such an image answered 1.16x as many over HTTP and
1.06x over gRPC (``bench/LARGE_INPUTS.md``).

glibc reads its tunables once, at start, so ``serve`` sets ``GLIBC_TUNABLES`` and execs
itself again before it has a thread or a socket; the processes it starts inherit the
setting. A ``GLIBC_TUNABLES`` that already names the tunable wins: set
``glibc.cpu.x86_rep_movsb_threshold=2112`` (glibc's default) to keep REP MOVSB. Intel CPUs,
other architectures and other C libraries are left as they are.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLES = "GLIBC_TUNABLES"
REP_MOVSB_THRESHOLD = "glibc.cpu.x86_rep_movsb_threshold"
NEVER = 1 << 40
"""A threshold no copy reaches: 1 TiB."""
SETTING = f"{REP_MOVSB_THRESHOLD}={NEVER}"
AMD = "AuthenticAMD"


def tuned_environment(
    environ: Mapping[str, str], *, libc: str, machine: str, vendor: str
) -> dict[str, str] | None:
    """``environ`` with REP MOVSB turned off, or None where nothing should change: not
    glibc on an x86-64 AMD CPU, or the tunable already set (by an earlier pass, or by the
    operator)."""
    if libc != "glibc" or machine.lower() not in ("x86_64", "amd64") or vendor != AMD:
        return None
    current = environ.get(TUNABLES, "")
    if f"{REP_MOVSB_THRESHOLD}=" in current:
        return None
    return {**environ, TUNABLES: f"{current}:{SETTING}" if current else SETTING}


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first ``vendor_id`` in ``cpuinfo``; empty where there is none (not Linux)."""
    try:
        with cpuinfo.open() as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        pass
    return ""


def restart_tuned() -> None:
    """Exec this program again with REP MOVSB off, where that applies; return otherwise
    (also when the exec fails: the server then runs with glibc's default)."""
    environ = tuned_environment(
        os.environ,
        libc=platform.libc_ver()[0],
        machine=platform.machine(),
        vendor=cpu_vendor(),
    )
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, environ)
    except OSError as exc:
        print(f"batchserve serve: could not restart with {SETTING}: {exc}", file=sys.stderr)


def rep_movsb_off() -> bool:
    """Whether this process started with REP MOVSB off (for the start-up log)."""
    return SETTING in os.environ.get(TUNABLES, "")
