"""NVIDIA's perf_analyzer drives the server over both protocols without a single error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.server import REPO_ROOT


def test_perf_analyzer_runs_cleanly_on_both_protocols(tmp_path: Path) -> None:
    out = tmp_path / "smoke.md"
    command = [sys.executable, str(REPO_ROOT / "bench" / "perf_smoke.py"),
               "--concurrency", "4", "--window-ms", "800", "--stability", "1000",
               "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [
        line for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line
    ]
    table = rows[1:]
    served = {(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in table}
    assert served == {(m, p) for m in ("digits_cnn", "char_lstm") for p in ("http", "grpc")}
    for row in table:
        assert float(row.split("|")[4].replace(",", "")) > 0
