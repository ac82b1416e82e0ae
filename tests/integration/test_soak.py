"""Short soaks through `python -m bench.soak`: the real server passes, a leaking one fails.

Both run at once (they load the machine alike, and CI time is short) at a modest rate;
the leaking server keeps 256 KiB per `digits_cnn` batch, far over the 16 MiB allowance
within the run, while the real server's RSS moves well under 1 MiB once warm.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.server import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.alone]

# 7-second windows on a shared CI machine make p99 too noisy to judge drift by (the unit
# tests cover that check): here only a drift of 20x would fail.
SHORT = ["--duration", "25", "--warmup", "10", "--window", "7", "--sample-every", "1",
         "--rate", "60", "--workers", "4", "--max-p99-drift", "20"]  # fmt: skip


@dataclass(frozen=True)
class Soaked:
    code: int
    output: str
    report: str

    def check(self, name: str) -> str:
        """PASS or FAIL on the report's row for one check."""
        row = next(line for line in self.report.splitlines() if line.startswith(f"| {name} |"))
        return row.split("|")[2].strip()


def _start(extra: list[str], output: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.soak", *SHORT, *extra, "--output", str(output)]
    return subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Soaked]:
    work = tmp_path_factory.mktemp("soak")
    runs = {"plain": [], "leaky": ["--leaky", "--leak-kib", "256"]}
    processes = {name: _start(extra, work / name) for name, extra in runs.items()}
    results = {}
    try:
        for name, process in processes.items():
            output, _ = process.communicate(timeout=300)
            report = (work / name).read_text() if (work / name).exists() else ""
            results[name] = Soaked(process.returncode, output, report)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    return results


def test_real_server_passes(soaked: dict[str, Soaked]) -> None:
    run = soaked["plain"]
    assert run.code == 0, run.output
    assert "## Verdict: PASS" in run.report
    assert all(run.check(c) == "PASS" for c in ("errors", "server alive", "RSS growth"))
    assert "| bad: truncated binary (http-raw) |" in run.report


def test_leaking_server_fails_on_memory_alone(soaked: dict[str, Soaked]) -> None:
    run = soaked["leaky"]
    assert run.code == 1, run.output
    assert "## Verdict: FAIL" in run.report
    assert run.check("RSS growth") == "FAIL"
    assert run.check("errors") == "PASS"
    assert run.check("server alive") == "PASS"
