"""A server started under a low soft open-files limit (systemd's and Docker's is 1024; 256
here keeps the test small) raises it to the hard limit, and so do its workers, which
inherit it: idle connections beyond the old limit no longer refuse the new ones (HTTP's were
closed as soon as accepted, gRPC's timed out)."""

from __future__ import annotations

import resource
import shutil
import socket
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.runtime.open_files import MOST

from tests.integration.server import ServerProcess, start_server

SOFT = 256
IDLE_HTTP = 600
IDLE_GRPC = 300
OWN_SOFT, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
RAISED = min(HARD, MOST)

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and runs prlimit (Linux)"),
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit"),
    pytest.mark.skipif(
        min(OWN_SOFT, HARD) < 4 * (IDLE_HTTP + IDLE_GRPC) // 3,
        reason="this process cannot open the idle connections, or the hard limit is low",
    ),
]


def _soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-files limit for {pid}")


def _classify_over_both(server: ServerProcess) -> None:
    image = np.zeros((1, 1, 8, 8), np.float32)
    http_input = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
    http_input.set_data_from_numpy(image)
    with httpclient.InferenceServerClient(
        server.http_url, connection_timeout=5, network_timeout=5
    ) as http:
        logits = http.infer("digits_cnn", [http_input]).as_numpy("logits")
        assert logits is not None
        assert logits.shape == (1, 10)
    grpc_input = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
    grpc_input.set_data_from_numpy(image)
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        logits = grpc.infer("digits_cnn", [grpc_input], client_timeout=5).as_numpy("logits")
        assert logits is not None
        assert logits.shape == (1, 10)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_low_soft_limit_is_raised_for_the_server_and_its_workers(workers: int) -> None:
    server = start_server(
        extra_args=["--workers", str(workers)], wrapper=["prlimit", f"--nofile={SOFT}:"]
    )
    try:
        server.drain_logs()
        (listening,) = [r for r in server.logs if r.get("message") == "listening"]
        assert listening["open_files_limit"] == RAISED
        started = [int(str(r["pid"])) for r in server.logs if r.get("message") == "worker started"]
        assert len(started) == (workers if workers > 1 else 0)
        assert [_soft_limit(pid) for pid in [server.process.pid, *started]] == [RAISED] * (
            1 + len(started)
        )
        with ExitStack() as idle:
            for port, count in ((server.http_port, IDLE_HTTP), (server.grpc_port, IDLE_GRPC)):
                for _ in range(count):
                    idle.enter_context(socket.create_connection(("127.0.0.1", port)))
            _classify_over_both(server)  # more connections open than the old limit allowed
        _classify_over_both(server)
    finally:
        assert server.stop() == 0
