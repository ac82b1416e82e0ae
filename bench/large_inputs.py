"""Large inputs and glibc's REP MOVSB: what copying a tensor costs, and a server whose
requests carry an image, with the REP MOVSB copy path on and off (``runtime/memmove_tuning.py``).
Writes bench/LARGE_INPUTS.md.

    python -m bench.large_inputs [--rounds 4] [--window-ms 3000] [--concurrency 16] [--out FILE]

Copies: in two child processes, one with glibc's default threshold for REP MOVSB and one
with it off (as ``serve`` starts on AMD CPUs), the median time numpy takes to copy blocks of
several sizes to a destination at 0 and at 16 bytes past the source, modulo 4 KiB. Server:
``image_mean`` (``bench.repo``: a FP32 3x192x192 image in, its channel means out, so that
moving the request is most of its cost), served by two batchserve processes that differ
only in that setting, measured with perf_analyzer over gRPC and HTTP; in each round the two
take turns at each point (the default first in odd rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from batchserve.runtime.memmove_tuning import REP_MOVSB_THRESHOLD, SETTING, TUNABLES

from bench import machine, perf, procstat, repo, servers
from bench.common import ROOT
from bench.records import ServerPoint

GLIBC_DEFAULT = f"{REP_MOVSB_THRESHOLD}=2112"
"""glibc's own threshold: REP MOVSB for copies of 2,112 bytes and more."""
SETTINGS = {"glibc default": GLIBC_DEFAULT, "REP MOVSB off": SETTING}
OFFSETS = (0, 16)
"""Destination minus source, in bytes, modulo 4 KiB."""
SIZES = {
    "64 KiB": 64 << 10,
    "UINT8 224x224x3 image, 147 KiB": 224 * 224 * 3,
    "FP32 3x192x192 image, 432 KiB": 3 * 192 * 192 * 4,
    "FP32 3x224x224 image, 588 KiB": 3 * 224 * 224 * 4,
}
PROTOCOLS = ("grpc", "http")

COPY_PROBE = """
import json, sys, timeit
import numpy as np
sizes, offsets = json.loads(sys.argv[1]), json.loads(sys.argv[2])
times = {}
for size in sizes:
    source = np.ones(size + 3 * 8192, np.uint8)
    target = np.zeros(size + 3 * 8192, np.uint8)
    at_s = 1024 + (-source.ctypes.data) % 4096
    at_t = 1024 + (-target.ctypes.data) % 4096
    for offset in offsets:
        s, t = source[at_s:at_s + size], target[at_t + offset:at_t + offset + size]
        runs = timeit.repeat(lambda: np.copyto(t, s), number=20, repeat=15)
        times[f"{size} {offset}"] = sorted(runs)[len(runs) // 2] / 20 * 1e6
print(json.dumps(times))
"""


def copy_times(tunables: str) -> dict[tuple[int, int], float]:
    """Microseconds per copy by (size, offset), in a child started with ``tunables``."""
    env = {**os.environ, TUNABLES: tunables}
    args = [json.dumps(list(SIZES.values())), json.dumps(OFFSETS)]
    run = subprocess.run(
        [sys.executable, "-c", COPY_PROBE, *args],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    times: dict[str, float] = json.loads(run.stdout)
    return {(int(k.split()[0]), int(k.split()[1])): v for k, v in times.items()}


@dataclass(frozen=True)
class Pair:
    """One protocol's points, a round per element, for each setting."""

    protocol: str
    points: Mapping[str, Sequence[ServerPoint]]

    def median(self, setting: str, figure: str) -> float:
        values = [getattr(p, figure) for p in self.points[setting] if p.row is not None]
        return statistics.median(values) if values else math.nan

    def ratios(self, figure: str) -> list[float]:
        """Each round's off / default, the two taken back to back."""
        default, off = self.points["glibc default"], self.points["REP MOVSB off"]
        return [
            getattr(b, figure) / getattr(a, figure)
            for a, b in zip(default, off, strict=True)
            if a.row is not None and b.row is not None
        ]


def measure_servers(
    repository: Path, rounds: int, concurrency: int, settings: perf.PaSettings, work: Path
) -> list[Pair]:
    """Both servers up at once (the idle one takes no CPU), the settings alternating."""
    taken: dict[tuple[str, str], list[ServerPoint]] = {}
    with ExitStack() as stack:
        running = {
            name: stack.enter_context(
                servers.batchserve(repository, repo.IMAGE_MEAN, env={TUNABLES: tunables})
            )
            for name, tunables in SETTINGS.items()
        }
        for number in range(1, rounds + 1):
            order = list(SETTINGS) if number % 2 else list(SETTINGS)[::-1]
            for protocol in PROTOCOLS:
                for name in order:
                    point = servers.measure(
                        running[name], repo.IMAGE_MEAN, protocol, concurrency, "on", settings, work
                    )
                    taken.setdefault((protocol, name), []).append(point)
                    print(
                        f"round {number}: {name} {protocol} c={concurrency}: "
                        f"{point.throughput:,.0f}/s, {point.cpu_us_per_request:,.0f} us CPU",
                        flush=True,
                    )
    return [Pair(p, {name: taken[(p, name)] for name in SETTINGS}) for p in PROTOCOLS]


def render(
    header: Sequence[str],
    copies: Mapping[str, Mapping[tuple[int, int], float]],
    pairs: Sequence[Pair],
    concurrency: int,
    notes: Sequence[str],
) -> str:
    lines = ["# Large inputs: glibc's REP MOVSB and the copies of an image", ""]
    lines += [*(f"- {h}" for h in header), ""]
    lines += [
        "## One block copied, by its size and where the destination lies",
        "",
        "Median microseconds per copy (numpy `copyto`, 15 x 20 copies each); the offset is "
        "the destination's address minus the source's, modulo 4 KiB.",
        "",
        "| block | " + " | ".join(f"{n}, offset {o:+d}" for n in copies for o in OFFSETS) + " |",
        "|---|" + "---:|" * (len(copies) * len(OFFSETS)),
    ]
    for label, size in SIZES.items():
        cells = " | ".join(f"{times[(size, o)]:.1f}" for times in copies.values() for o in OFFSETS)
        lines.append(f"| {label} | {cells} |")
    lines += [
        "",
        f"## A server whose requests carry the image (`image_mean`, c={concurrency})",
        "",
        "Medians over the rounds; the ratio is REP MOVSB off / glibc default in each round, "
        "the two taken back to back (median, range).",
        "",
        "| protocol | infer/s default | infer/s off | throughput off/default "
        "| server CPU us/infer default | off | CPU off/default |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in pairs:
        lines.append(
            f"| {pair.protocol} | {pair.median('glibc default', 'throughput'):,.0f} | "
            f"{pair.median('REP MOVSB off', 'throughput'):,.0f} | "
            f"{_spread(pair.ratios('throughput'))} | "
            f"{pair.median('glibc default', 'cpu_us_per_request'):,.0f} | "
            f"{pair.median('REP MOVSB off', 'cpu_us_per_request'):,.0f} | "
            f"{_spread(pair.ratios('cpu_us_per_request'))} |"
        )
    lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def rounds_rows(pairs: Sequence[Pair]) -> Iterator[str]:
    """Every point, for the notes."""
    for pair in pairs:
        for name, points in pair.points.items():
            figures = ", ".join(
                f"{p.throughput:,.0f}/s {p.cpu_us_per_request:,.0f} us" for p in points
            )
            yield f"{pair.protocol}, {name}: {figures}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.large_inputs", description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "LARGE_INPUTS.md")
    args = parser.parse_args(argv)
    header = machine.describe()
    header.append(f"1-minute load average at the start: {procstat.load1():.2f}")
    copies = {name: copy_times(tunables) for name, tunables in SETTINGS.items()}
    settings = perf.PaSettings(args.window_ms)
    with tempfile.TemporaryDirectory(prefix="bench-large-inputs-") as tmp:
        repository = Path(tmp) / "repo"
        repo.write_image_mean(repository)
        pairs = measure_servers(repository, args.rounds, args.concurrency, settings, Path(tmp))
    notes = [
        f"Command: `python -m bench.large_inputs --rounds {args.rounds} --window-ms "
        f"{args.window_ms} --concurrency {args.concurrency}`.",
        f"glibc default: `{TUNABLES}={GLIBC_DEFAULT}`; REP MOVSB off: `{TUNABLES}={SETTING}`, "
        "what `batchserve serve` sets for itself on AMD CPUs.",
        "perf_analyzer sends batch 1 per request, binary tensors, its random data; server "
        "CPU: user + system CPU of the server process over the point, per inference counted.",
        "Every point (infer/s, server CPU a request): " + "; ".join(rounds_rows(pairs)) + ".",
    ]
    args.out.write_text(render(header, copies, pairs, args.concurrency, notes))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
