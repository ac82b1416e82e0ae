"""Start a real `batchserve serve` process on OS-chosen loopback ports and stop it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tritonclient.http as tritonhttp
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPO = REPO_ROOT / "model_repo"
WAITED_FOR_CLIENTS = "waited for HTTP clients to close their connections"
"""The server's line as its stop's wait for HTTP clients ends (``runtime/http_listener.py``;
not imported: the server's protos and tritonclient's share file names)."""
LONGEST_CLIENT_WAIT_S = 5.0
"""Longer, and a test's stop waited for an idle connection it left open (the keep-alive
timer or the exit timeout ended it), not for answers still on their way."""
CONTROL_TOKEN = "s3cret-token"
"""The model-control token of the ``explicit_server`` fixture."""


TRITON_HTTP_CLIENTS: weakref.WeakSet[tritonhttp.InferenceServerClient] = weakref.WeakSet()
"""Every tritonclient HTTP client the tests make, for ``ServerProcess.stop`` to close."""


def _track_triton_http_clients() -> None:
    """A program using tritonclient closes its connections when it exits; a test's client
    lives on past the server's stop, which (as Triton's) waits for connections its clients
    still hold. So the harness notes each client made, and closes those of a server before
    stopping it. The client itself is unchanged."""
    made = tritonhttp.InferenceServerClient.__init__

    def init(self: tritonhttp.InferenceServerClient, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        TRITON_HTTP_CLIENTS.add(self)

    tritonhttp.InferenceServerClient.__init__ = init


_track_triton_http_clients()


@dataclass
class ServerProcess:
    """A running server, its ports and every log record it has written."""

    process: subprocess.Popen[str]
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    logs: list[dict[str, object]] = field(default_factory=list)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _pump_thread: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, message: str, timeout: float = 120.0) -> dict[str, object]:
        """Read log records until one has this message; fail if the process dies first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"server exited ({self.process.wait()}) before '{message}'")
            record = _parse(line)
            self.logs.append(record)
            if record.get("message") == message:
                return record
            if str(record.get("message", "")).startswith("server not ready"):
                failures = [r for r in self.logs if r.get("level") == "ERROR"]
                raise RuntimeError(f"server is not ready: {failures}")
        raise TimeoutError(f"server did not log '{message}' within {timeout} s")

    def drain_logs(self) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.logs.append(_parse(line))

    def worker_pids(self) -> dict[int, int]:
        """The latest pid of each worker slot (``--workers N``), from the log."""
        self.drain_logs()
        pids: dict[int, int] = {}
        for record in self.logs:
            if record.get("message") == "worker started":
                pids[int(str(record["worker"]))] = int(str(record["pid"]))
        return pids

    def stop(self, timeout: float = 60.0, clients_may_linger: bool = False) -> int:
        """SIGTERM, wait for a clean exit, and collect the last log records. The stop waits,
        as Triton's does, for HTTP clients to close connections they opened before it (up to
        the exit timeout): a test that left one open (a tritonclient client not closed) fails
        here, unless it says it kept one on purpose, rather than making the suite wait."""
        for client in list(TRITON_HTTP_CLIENTS):
            if client._parsed_url.port == self.http_port:
                client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        if self._pump_thread is not None:
            self._pump_thread.join(timeout)
        self.drain_logs()
        if self.process.stderr is not None:
            self.process.stderr.close()
        waits = [r for r in self.logs if r.get("message") == WAITED_FOR_CLIENTS]
        long = [r for r in waits if float(str(r["seconds"])) > LONGEST_CLIENT_WAIT_S]
        if long and not clients_may_linger:
            raise AssertionError(f"the stop waited for a client the test left connected: {long}")
        return code


PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"
"""NVIDIA's perf_analyzer, from the tritonclient wheel in the environment running the tests."""


def rss_mib(pid: int) -> int:
    """A process's resident memory in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024


def tree_memory_mib(pid: int) -> int:
    """The memory a process and all its descendants (a server's workers) hold, MiB: their
    proportional set sizes, summed, so that a page they share counts once. Their resident
    sets counted the hand-off arenas in each process that maps them: 48 requests of 3 MiB
    through two workers grew the sum of resident sets 231-258 MiB, of these 132-156 MiB."""
    children = [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    kib = int(next(line for line in rollup if line.startswith("Pss:")).split()[1])
    return kib // 1024 + sum(tree_memory_mib(child) for child in children)


def run_perf_analyzer(model: str, protocol: str, url: str, *extra: str) -> str:
    """A short perf_analyzer run against ``model`` (800 ms windows, any stability) that must
    end cleanly and report a throughput; returns its report."""
    result = subprocess.run(
        [str(PERF_ANALYZER), "-m", model, "-i", protocol, "-u", url,
         "--measurement-interval", "800", "--stability-percentage", "1000", *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout
    return result.stdout


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` on the metrics port whose labels include ``labels``."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def _parse(line: str) -> dict[str, object]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return {"message": line.rstrip()}
    return record if isinstance(record, dict) else {"message": line.rstrip()}


def start_server(
    model_repository: Path = MODEL_REPO,
    extra_args: Sequence[str] = (),
    wait_ready: bool = True,
    extra_env: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> ServerProcess:
    """Launch the console script and wait until it listens (and, by default, is ready);
    under ``wrapper``, a command that runs the one it is given (``prlimit ...``), if any.

    One process unless ``extra_args`` or ``extra_env`` ask for workers: the default
    (``auto``) would start workers on a machine with more than two cores, and the suite's
    figures and log checks would then depend on the machine it runs on.
    """
    command = [
        *wrapper, sys.executable, "-m", "batchserve.cli", "serve",
        "--model-repository", str(model_repository),
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        "--log-format", "json", *extra_args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env["BATCHSERVE_WORKERS"] = "1"
    env.update(extra_env or {})
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    server = ServerProcess(process)
    server._pump_thread = threading.Thread(target=server._pump, daemon=True)
    server._pump_thread.start()
    try:
        listening = server.wait_for("listening")
        http, grpc = listening["http_port"], listening["grpc_port"]  # None: --allow-* false
        server.http_port = 0 if http is None else int(str(http))
        server.grpc_port = 0 if grpc is None else int(str(grpc))
        metrics = listening["metrics_port"]  # None: --allow-metrics false
        server.metrics_port = 0 if metrics is None else int(str(metrics))
        if wait_ready:
            server.wait_for("server ready")
    except BaseException:
        process.kill()  # never leave a half-started server behind a failed fixture
        server.stop()
        raise
    return server
