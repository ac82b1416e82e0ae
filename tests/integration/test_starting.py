"""How the server starts, or says why it cannot.

An IPv6 address serves every protocol. A port the server cannot have, or a model repository
that is not a directory, stops the start with the reason, no traceback, and exit status 3
(uvicorn's for a taken HTTP port), whichever port and however many workers. Each used to go
otherwise: a taken gRPC port, or any port held for workers, ended in a traceback; a taken HTTP
port, in one from the gRPC server left running as the process exited; ``--host ::1``, in a
gRPC address it could not resolve; a repository that is not a directory, in a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import MODEL_REPO, start_server

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
                       "Address already in use (another process holds it; --reuse-grpc-port "
                       "true shares it with that process)"]),
        ("2", "http", ["the server did not start: cannot serve HTTP on 127.0.0.1:{port}: "
                       "Address already in use (another process holds it; --reuse-http-port "
                       "true shares it with that process)"]),
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
    assert _failed_start(command) == [line.format(port=taken) for line in said]


def test_a_repository_that_is_not_a_directory_stops_the_start_with_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "models").write_text("a file")
    command = [
        sys.executable, "-m", "batchserve.cli", "serve", "--log-format", "json",
        "--model-repository", str(tmp_path / "models"),
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    assert _failed_start(command) == [
        f"the server did not start: model repository '{tmp_path / 'models'}' is not a directory"
    ]


def _failed_start(command: list[str]) -> list[str]:
    """The ERROR lines of a server that exited as one that could not start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == STARTUP_FAILURE, done.stderr
    assert "Traceback" not in done.stderr
    return [
        record["message"]
        for line in done.stderr.splitlines()
        if line.startswith("{") and (record := json.loads(line))["level"] == "ERROR"
    ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_ipv6_address_serves_every_protocol(workers: str) -> None:
    """gRPC takes an IPv6 literal only in brackets; uvicorn and the workers' sockets take it
    bare."""
    server = start_server(extra_args=["--host", "::1", "--workers", workers])
    try:
        image = np.zeros((1, 1, 8, 8), np.float32)
        answers = []
        for client, url in (
            (httpclient, f"[::1]:{server.http_port}"),
            (grpcclient, f"[::1]:{server.grpc_port}"),
        ):
            tensor = client.InferInput("image", [1, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(image)
            result = client.InferenceServerClient(url).infer("digits_cnn", [tensor])
            answers.append(result.as_numpy("probabilities"))
        with socket.create_connection(("::1", server.metrics_port), timeout=10) as metrics:
            metrics.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            scraped = b"".join(iter(lambda: metrics.recv(65536), b""))
    finally:
        assert server.stop() == 0
    np.testing.assert_allclose(answers[0], answers[1], rtol=1e-6)
    assert answers[0].shape == (1, 10)
    assert b'batchserve_requests_total{model="digits_cnn"' in scraped


def test_every_model_loads_with_load_model_star(tmp_path: Path) -> None:
    """Triton's ``--load-model=*``: it used to be taken for a model named '*', which failed,
    and the server was never ready."""
    for name in ("digits_cnn", "square_int32"):
        shutil.copytree(MODEL_REPO / name, tmp_path / name)
    server = start_server(tmp_path, ["--model-control-mode", "explicit", "--load-model", "*"])
    try:
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
            ready = http.get("/v2/health/ready").status_code
            index = http.post("/v2/repository/index").json()
    finally:
        assert server.stop() == 0
    assert ready == 200
    assert {(m["name"], m["state"]) for m in index} == {
        ("digits_cnn", "READY"),
        ("square_int32", "READY"),
    }
