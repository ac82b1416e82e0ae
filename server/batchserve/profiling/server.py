"""The server a profile drives: one `batchserve serve` subprocess for the whole sweep.

It runs with explicit model control on free loopback ports, and each setting is loaded
through the repository API with a ``config`` override, as Model Analyzer drives Triton: no
restart per point, and the repository on disk is never written while it runs. A random
control token keeps other local clients from loading models on it.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from google.protobuf import json_format

from batchserve.profiling.errors import ProfileError, ServerRefused
from batchserve.proto.model_config_pb2 import ModelConfig

START_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 600.0
"""A load runs the memory probe and the warm-up: minutes for a large model on a slow device."""
LOG_TAIL = 20
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """A loaded model's counters: requests, batches run, and the cap the memory budget left."""

    inferences: int
    executions: int
    batch_cap: int

    def average_batch_since(self, earlier: BatchFigures) -> float | None:
        executions = self.executions - earlier.executions
        return (self.inferences - earlier.inferences) / executions if executions > 0 else None


class ProfiledServer:
    """A running `batchserve serve`; ``start`` returns once it is ready, ``stop`` ends it."""

    def __init__(self, process: subprocess.Popen[str], token: str) -> None:
        self._process = process
        self._token = token
        self._tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self._ready = threading.Event()
        self.ports: dict[str, int] = {}
        threading.Thread(target=self._pump, daemon=True).start()

    @classmethod
    def start(cls, repository: Path, serve_args: Sequence[str] = ()) -> ProfiledServer:
        """The server on ``repository``; ``serve_args`` are further `serve` flags. It reads
        no BATCHSERVE_* variables, so the environment cannot change what is measured."""
        token = secrets.token_urlsafe(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
        env["BATCHSERVE_CONTROL_TOKEN"] = token
        argv = [
            sys.executable, "-m", "batchserve.cli", "serve",
            "--model-repository", str(repository), "--host", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--model-control-mode", "explicit", "--log-format", "json", *serve_args,
        ]  # fmt: skip
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        server = cls(process, token)
        if not server._ready.wait(START_TIMEOUT_S) or process.poll() is not None:
            server.stop()
            raise ProfileError(f"the server did not start: {server.log_tail()}")
        return server

    def __enter__(self) -> ProfiledServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def url(self, protocol: str) -> str:
        """``host:port`` of the protocol's port, as perf_analyzer's ``-u`` takes it."""
        return f"127.0.0.1:{self.ports['grpc_port' if protocol == 'grpc' else 'http_port']}"

    def load(self, model: str, config: ModelConfig | None = None) -> None:
        """Load ``model``, with ``config`` instead of its config.pbtxt when given.

        Raises ServerRefused with the server's reason (a config it rejects, a memory budget
        the setting does not fit).
        """
        parameters = {} if config is None else {"config": json_format.MessageToJson(config)}
        self._call(f"repository/models/{_quoted(model)}/load", {"parameters": parameters})

    def unload(self, model: str) -> None:
        """Release the model, so the next setting's load has the whole memory budget."""
        self._call(f"repository/models/{_quoted(model)}/unload", {})

    def config(self, model: str) -> ModelConfig:
        """The loaded model's config, completed by the server from its model file."""
        answer = self._call(f"models/{_quoted(model)}/config")
        return json_format.ParseDict(answer, ModelConfig(), ignore_unknown_fields=True)

    def batch_figures(self, model: str) -> BatchFigures:
        """The model's statistics, summed over its versions (the smallest cap of them)."""
        rows = self._call(f"models/{_quoted(model)}/stats")["model_stats"]
        return BatchFigures(
            inferences=sum(int(row["inference_count"]) for row in rows),
            executions=sum(int(row["execution_count"]) for row in rows),
            batch_cap=min(int(row["batchserve"]["batch_cap"]) for row in rows),
        )

    def log_tail(self) -> str:
        """The server's last log lines, for a message saying why it failed."""
        return "\n".join(self._tail) or "(no log output)"

    def stop(self) -> None:
        """SIGTERM and a short drain; killed if it does not exit."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _pump(self) -> None:
        """Read the log until the server is ready (or gone), then keep the pipe flowing."""
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self._tail.append(line.rstrip())
            record = _record(line)
            if record.get("message") == "listening":
                self.ports = {k: int(record[k]) for k in ("http_port", "grpc_port")}
            elif record.get("message") == "server ready":
                self._ready.set()
        self._ready.set()

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"http://{self.url('http')}/v2/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
            method="GET" if body is None else "POST",
        )
        try:
            with _NO_PROXY.open(request, timeout=LOAD_TIMEOUT_S) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            raise ServerRefused(_error_message(exc)) from None
        except OSError as exc:
            raise ProfileError(f"the server stopped answering ({exc}): {self.log_tail()}") from None
        return json.loads(data) if data else {}


def _quoted(model: str) -> str:
    return urllib.parse.quote(model, safe="")


def _record(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _error_message(error: urllib.error.HTTPError) -> str:
    """The ``{"error": ...}`` body batchserve answers with, else the status line."""
    try:
        return str(json.loads(error.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {error.code} {error.reason}"
