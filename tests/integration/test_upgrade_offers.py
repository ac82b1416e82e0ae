"""Requests that offer to switch protocols are served as HTTP/1.1, bodies included, by the
real server: ``curl --http2`` (which offers h2c on every ``http://`` request, as Java's HTTP
client does by default), and the same offers on a raw socket with requests behind them.

Before, the server answered curl's inference POST with 400 "malformed JSON: Input is a
zero-length, empty document": the parser had skipped the body as the new protocol's."""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.integration.server import ServerProcess

IMAGE = (np.arange(64, dtype=np.float32) % 17).reshape(1, 1, 8, 8)
BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "image",
                "datatype": "FP32",
                "shape": [1, 1, 8, 8],
                "data": IMAGE.ravel().tolist(),
            }
        ]
    }
).encode()
INFER = "/v2/models/digits_cnn/infer"
H2C = (  # what curl --http2 adds to a request on an http:// URL
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)


@pytest.fixture(scope="module")
def server(server_either_way: ServerProcess) -> ServerProcess:
    """Every test here against one process and against two workers."""
    return server_either_way


def _logits(answer: bytes) -> np.ndarray:
    return np.array(json.loads(answer)["outputs"][0]["data"], dtype=np.float32)


def test_curl_http2_posts_with_a_length_and_chunked_on_one_connection(
    server: ServerProcess, tmp_path: Path
) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is part of the test environment (the README's examples use it)"
    (tmp_path / "body.json").write_bytes(BODY)
    url = f"http://{server.http_url}{INFER}"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    result = subprocess.run(
        [curl, "-sS", "--http2", url, "--data-binary", "@body.json", "-o", str(first),
         "-w", "%{http_code} %{num_connects}\n", "--next", "--http2", url,
         "-H", "Transfer-Encoding: chunked", "--data-binary", "@body.json", "-o", str(second),
         "-w", "%{http_code} %{num_connects}\n"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # both answered 200; the second on the first's connection (no new connect)
    assert result.stdout.split("\n")[:2] == ["200 1", "200 0"], (result.stdout, first.read_text())
    plain = httpx.post(url, content=BODY, timeout=30)
    assert plain.status_code == 200, plain.text
    expected = _logits(plain.content)
    assert expected.shape == (10,)
    np.testing.assert_array_equal(_logits(first.read_bytes()), expected)
    np.testing.assert_array_equal(_logits(second.read_bytes()), expected)


def _exchange(server: ServerProcess, data: bytes, answers: int) -> tuple[list[bytes], bool]:
    """Send ``data`` at once; read until ``answers`` JSON bodies came (each response carries
    content-length) or the server closed. Returns the bodies and whether it closed."""
    host, port = server.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        received, bodies, closed = b"", [], False
        while len(bodies) < answers and not closed:
            readable, _, _ = select.select([sock], [], [], 30)
            assert readable, f"no answer within 30 s; got {bodies}"
            chunk = sock.recv(65536)
            closed = not chunk
            received += chunk
            while b"\r\n\r\n" in received:
                head, _, rest = received.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))  # fmt: skip
                if len(rest) < length:
                    break
                status = int(head.split(b" ", 2)[1])
                bodies.append(b"%d " % status + rest[:length])
                received = rest[length:]
        if not closed:
            readable, _, _ = select.select([sock], [], [], 0.5)
            closed = bool(readable) and sock.recv(1) == b""
    return bodies, closed


def test_an_offer_with_a_body_then_a_request_behind_it_are_both_answered(
    server: ServerProcess,
) -> None:
    offer = b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (
        INFER.encode(),
        H2C,
        len(BODY),
        BODY,
    )
    behind = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"
    bodies, closed = _exchange(server, offer + behind, answers=2)
    assert [body[:4] for body in bodies] == [b"200 ", b"200 "], bodies
    assert _logits(bodies[0][4:]).shape == (10,)
    assert json.loads(bodies[1][4:]) == {"ready": True}
    assert not closed


def test_a_websocket_handshake_is_answered_as_a_get_and_connect_is_refused_and_closed(
    server: ServerProcess,
) -> None:
    handshake = (
        b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    bodies, closed = _exchange(server, handshake + handshake, answers=2)
    assert bodies == [b'200 {"live":true}'] * 2
    assert not closed
    tunnel = (
        b"CONNECT /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\nGET /v2/health/live HTTP/1.1\r\n\r\n"
    )
    bodies, closed = _exchange(server, tunnel, answers=2)
    assert [body[:4] for body in bodies] == [b"405 "], bodies
    assert closed
