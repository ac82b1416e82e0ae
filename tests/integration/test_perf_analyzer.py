"""NVIDIA's perf_analyzer drives the server over both protocols without a single error, and
opens the gRPC connections the benches ask for."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from bench.perf import PaSettings, run
from tests.integration.server import REPO_ROOT, ServerProcess


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


def _connections_to(port: int) -> int:
    """The server's established TCP connections on ``port``, from /proc (a dual-stack listener
    keeps IPv4 clients in the IPv6 table)."""
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            count += int(local.rsplit(":", 1)[1], 16) == port and state == "01"
    return count


def _most_connections_during(settings: PaSettings, server: ServerProcess, work: Path) -> int:
    """The most connections perf_analyzer held open at once, beyond those open before it
    (an earlier test's client may still hold one to this shared server)."""
    before = _connections_to(server.grpc_port)
    seen = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            seen[0] = max(seen[0], _connections_to(server.grpc_port))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        row, error = run("digits_cnn", "grpc", server.grpc_url, 8, settings, work)
    finally:
        done.set()
        watcher.join()
    assert row is not None, error
    assert row.throughput > 0
    return seen[0] - before


def test_perf_analyzer_opens_a_grpc_connection_per_client_when_asked(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The benches that spread load over worker processes ask for it; the C++ client library
    perf_analyzer is built on shares a connection between six clients unless told."""
    settings = PaSettings(800, stability=1000, max_trials=3)
    shared = _most_connections_during(settings, server, tmp_path)
    own = _most_connections_during(replace(settings, grpc_connection_per_client=True), server,
                                   tmp_path)  # fmt: skip
    assert own >= 8, own
    assert shared <= 3, shared
