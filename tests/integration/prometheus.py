"""A real Prometheus server (Debian's `prometheus` package) on loopback, for the tests.

It runs with its own storage in a temporary directory and a free port, scraping one target
every second with the job, rule files and settings of `deploy/prometheus/prometheus.yml`;
only the Kubernetes discovery (which Debian's build leaves out) is swapped for the target.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.server import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy" / "prometheus"
CONFIG = DEPLOY / "prometheus.yml"
RULES = DEPLOY / "rules.yml"


def binary(name: str) -> str:
    """Path of `prometheus` or `promtool`; a clear failure where the package is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: `make test` installs Debian's prometheus package "
            "(scripts/install_prometheus.sh), or run `apt-get install prometheus`"
        )
    return path


def promtool(*args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """promtool run in deploy/prometheus (so rule files resolve as they do in production)."""
    command = [binary("promtool"), *args]
    return subprocess.run(
        command, cwd=DEPLOY, input=input_text, capture_output=True, text=True, timeout=120
    )


def without_kubernetes(config: dict[str, Any], target: str, interval: str) -> dict[str, Any]:
    """The shipped config scraping ``target`` instead of discovering pods; the relabelling of
    pod metadata goes with the discovery, every other setting of the job stays."""
    jobs = []
    for job in config["scrape_configs"]:
        kept = {
            k: v for k, v in job.items() if k != "relabel_configs" and not k.endswith("_sd_configs")
        }
        jobs.append(
            {**kept, "static_configs": [{"targets": [target]}], "scrape_interval": interval}
        )
    global_ = {**config["global"], "scrape_interval": interval, "evaluation_interval": interval}
    rules = [str(DEPLOY / name) for name in config["rule_files"]]
    return {**config, "global": global_, "rule_files": rules, "scrape_configs": jobs}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    process: subprocess.Popen[str]
    url: str
    log: Path

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        body = response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (or an error naming the expression)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.get("/api/v1/query", **params)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def value(self, expr: str, at: float | None = None) -> float:
        """The single value an expression gives."""
        result = self.query(expr, at)
        assert len(result) == 1, f"{expr}: {result}"
        return float(result[0]["value"][1])

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.25)
        raise TimeoutError(f"Prometheus: {what} within {timeout} s (log: {self.log.read_text()})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def start_prometheus(directory: Path, target: str, interval: str = "1s") -> Prometheus:
    """Prometheus scraping ``target`` with the shipped job and rules, storing in ``directory``."""
    config = without_kubernetes(yaml.safe_load(CONFIG.read_text()), target, interval)
    config_file = directory / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port, log = free_port(), directory / "prometheus.log"
    command = [
        binary("prometheus"),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log)
    prometheus.wait_until("ready", lambda: _ready(prometheus))
    return prometheus


def _ready(prometheus: Prometheus) -> bool:
    if prometheus.process.poll() is not None:
        raise RuntimeError(f"prometheus exited: {prometheus.log.read_text()}")
    try:
        return httpx.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
