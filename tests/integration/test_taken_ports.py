"""A port the server is told to serve and cannot have: the reason, no traceback, and exit
status 3 (uvicorn's for a taken HTTP port), whichever port and however many workers. A taken
gRPC port, or any port held for workers, used to end in a traceback; a taken HTTP port, in
one from the gRPC server left running as the process exited."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_FAILURE = 3


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another program listens on, without ``SO_REUSEPORT``."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize(
    ("workers", "protocol", "said"),
    [
        ("1", "grpc", ["the server did not start: cannot serve gRPC on 127.0.0.1:{port}: the "
                       "port is taken, or the address is not this host's"]),
        ("1", "http", ["[Errno 98] error while attempting to bind on address ('127.0.0.1', "
                       "{port}): address already in use",
                       "the server did not start: cannot serve HTTP on 127.0.0.1:{port} (why: "
                       "above)"]),
        ("1", "metrics", ["[Errno 98] error while attempting to bind on address "
                          "('127.0.0.1', {port}): address already in use",
                          "the server did not start: cannot serve metrics on "
                          "127.0.0.1:{port} (why: above)"]),
        ("2", "grpc", ["the server did not start: cannot serve gRPC on 127.0.0.1:{port}: "
                       "Address already in use"]),
        ("2", "http", ["the server did not start: cannot serve HTTP on 127.0.0.1:{port}: "
                       "Address already in use"]),
    ],
)  # fmt: skip
def test_a_taken_port_stops_the_start_with_one_line(
    tmp_path: Path, taken: int, workers: str, protocol: str, said: list[str]
) -> None:
    ports = {"http": "0", "grpc": "0", "metrics": "0", protocol: str(taken)}
    command = [
        sys.executable, "-m", "batchserve.cli", "serve", "--model-repository", str(tmp_path),
        "--http-port", ports["http"], "--grpc-port", ports["grpc"],
        "--metrics-port", ports["metrics"], "--workers", workers, "--log-format", "json",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == STARTUP_FAILURE, done.stderr
    assert "Traceback" not in done.stderr
    errors = [
        record["message"]
        for line in done.stderr.splitlines()
        if line.startswith("{") and (record := json.loads(line))["level"] == "ERROR"
    ]
    assert errors == [line.format(port=taken) for line in said]
