"""HTTP/1.1 pipelining against a real server: a client that pipelines gets every answer in
order, and clients that pipeline without reading their answers cannot make the server hold
what they send (20 such connections made it hold 1.1 GB before the bound)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.integration.server import ServerProcess, rss_mib, start_server

INFER = "/v2/models/digits_cnn/infer"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server()
    yield process
    assert process.stop() == 0


def _infer_request(value: float) -> bytes:
    image = [value] * 64
    body = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                                   "data": image}]}).encode()  # fmt: skip
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def _read_responses(sock: socket.socket, count: int) -> list[dict[str, object]]:
    buffered, bodies = b"", []
    while len(bodies) < count:
        while b"\r\n\r\n" not in buffered:
            buffered += sock.recv(65536)
        head, _, buffered = buffered.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(buffered) < length:
            buffered += sock.recv(65536)
        bodies.append(json.loads(buffered[:length]))
        buffered = buffered[length:]
    return bodies


def test_pipelined_requests_are_all_answered_in_order(server: ServerProcess) -> None:
    values = [n / 10 for n in range(100)]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"".join(_infer_request(v) for v in values))
        answers = _read_responses(sock, len(values))
    logits = [np.array(a["outputs"][0]["data"]) for a in answers]  # type: ignore[index]
    single = {}
    for value in (values[0], values[-1]):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
            sock.sendall(_infer_request(value))
            single[value] = np.array(_read_responses(sock, 1)[0]["outputs"][0]["data"])  # type: ignore[index]
    np.testing.assert_allclose(logits[0], single[values[0]], rtol=1e-5)
    np.testing.assert_allclose(logits[-1], single[values[-1]], rtol=1e-5)
    assert not np.allclose(logits[0], logits[-1])  # each answer is its own request's


def test_pipelining_clients_that_never_read_cannot_grow_the_server(server: ServerProcess) -> None:
    request = _infer_request(0.5) * 200
    before = rss_mib(server.process.pid)
    sockets, sent = [], 0
    try:
        for _ in range(10):
            sock = socket.create_connection(("127.0.0.1", server.http_port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            sockets.append(sock)
        offsets = [0] * len(sockets)
        give_up = time.monotonic() + 4
        while time.monotonic() < give_up:
            moved = 0
            for i, sock in enumerate(sockets):
                try:
                    n = sock.send(request[offsets[i] :])
                except BlockingIOError:
                    continue
                offsets[i] = (offsets[i] + n) % len(request)
                moved += n
            sent += moved
            if not moved:
                time.sleep(0.05)
        grown = rss_mib(server.process.pid) - before
        assert sent > 10 * 2**20  # the kernel's buffers took a good share before it stopped
        assert grown < 64, f"{grown} MiB more held after {sent / 2**20:.0f} MiB pipelined"
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as other:
            other.sendall(_infer_request(0.25))
            assert _read_responses(other, 1)[0]["model_name"] == "digits_cnn"
    finally:
        for sock in sockets:
            sock.close()
