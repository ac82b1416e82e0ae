"""Clients too slow to send a request, requests that do not parse, and bodies still arriving
at shutdown, against a real server over loopback with short read timeouts (1 s).

A silent or trickling connection must not be held: a few hundred of them would otherwise
hold every descriptor of the process, and one half-sent body held shutdown for 30 s.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.integration.server import ServerProcess, metric, start_server

TIMEOUTS = ["--http-header-timeout", "1", "--http-body-timeout", "1",
            "--http-body-min-rate", "1000"]  # fmt: skip
SLACK = 3.0
"""Seconds past a timeout by which the server must have acted, even on a busy machine."""
INFER = "/v2/models/digits_cnn/infer"
IMAGE = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17
GOOD = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                    "data": IMAGE.ravel().tolist()}]}  # fmt: skip
REFUSALS = "batchserve_refusals_total"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(extra_args=TIMEOUTS)
    yield process
    assert process.stop() == 0


def _connect(port: int) -> socket.socket:
    """A socket whose reads give up well after the server should have acted."""
    return socket.create_connection(("127.0.0.1", port), timeout=1 + 2 * SLACK)


def _read_to_end(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def _trickle(sock: socket.socket, data: bytes, every: float) -> None:
    """Send ``data`` a byte at a time until the server stops listening (or for as long as it
    should have taken to)."""
    give_up = time.monotonic() + 1 + SLACK
    try:
        for byte in data:
            sock.sendall(bytes([byte]))
            time.sleep(every)
            if time.monotonic() > give_up:
                return
    except (BrokenPipeError, ConnectionResetError):
        pass


def _json_error(answer: bytes, status: int) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    assert b"\r\nconnection: close" in head
    assert b"\r\ncontent-type: application/json" in head
    message = json.loads(body)["error"]
    assert isinstance(message, str)
    return message


def _errors_logged(server: ServerProcess) -> list[dict[str, object]]:
    server.drain_logs()
    return [r for r in server.logs if r.get("level") == "ERROR"]


@pytest.mark.parametrize("listener", ["http", "metrics"])
def test_a_connection_that_never_sends_a_byte_is_closed(
    server: ServerProcess, listener: str
) -> None:
    port = server.http_port if listener == "http" else server.metrics_port
    before = metric(server, REFUSALS, protocol=listener, reason="header_timeout")
    started = time.monotonic()
    with _connect(port) as sock:
        answer = _read_to_end(sock)
    seconds = time.monotonic() - started
    assert answer == b""  # nothing was asked, so nothing is answered
    assert 0.9 < seconds < 1 + SLACK
    after = metric(server, REFUSALS, protocol=listener, reason="header_timeout")
    assert after == before + 1


def test_a_head_sent_a_byte_at_a_time_is_408(server: ServerProcess) -> None:
    before = metric(server, REFUSALS, protocol="http", reason="header_timeout")
    started = time.monotonic()
    with _connect(server.http_port) as sock:
        _trickle(sock, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", every=0.2)
        answer = _read_to_end(sock)
    seconds = time.monotonic() - started
    assert "headers" in _json_error(answer, 408)
    assert seconds < 1 + SLACK
    assert metric(server, REFUSALS, protocol="http", reason="header_timeout") == before + 1


def test_a_kept_alive_connection_may_idle_longer_than_the_header_timeout(
    server: ServerProcess,
) -> None:
    """The header clock starts at a request's first byte; the idle gap is keep-alive's."""
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        sockets = []
        for _ in range(2):
            connection.request("GET", "/v2/health/live")
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read()) == {"live": True}
            sockets.append(connection.sock)
            time.sleep(1.5)
        assert sockets[0] is sockets[1]  # one connection for both requests
    finally:
        connection.close()


@pytest.mark.parametrize("path", [INFER, "/v2/logging"], ids=["inference", "framework route"])
def test_a_body_sent_below_the_minimum_rate_is_408(server: ServerProcess, path: str) -> None:
    before = metric(server, REFUSALS, protocol="http", reason="body_timeout")
    errors = len(_errors_logged(server))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with _connect(server.http_port) as sock:
        sock.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode())
        started = time.monotonic()
        _trickle(sock, b" " * 1000, every=0.1)  # 10 bytes a second
        answer = _read_to_end(sock)
    seconds = time.monotonic() - started
    assert "body" in _json_error(answer, 408)
    assert seconds < 1 + SLACK
    assert metric(server, REFUSALS, protocol="http", reason="body_timeout") == before + 1
    time.sleep(0.2)  # the route saw the disconnect: it must neither log nor answer a 500
    assert _errors_logged(server)[errors:] == []


def test_an_upload_above_the_minimum_rate_is_served_however_long_it_takes(
    server: ServerProcess,
) -> None:
    """2.5 s for a body whose timeout is 1 s: each 1000 bytes earn a second more."""
    body = json.dumps(GOOD).encode().ljust(6250)  # JSON allows trailing spaces
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with _connect(server.http_port) as sock:
        sock.sendall(head.encode())
        started = time.monotonic()
        for offset in range(0, len(body), 625):  # 2500 bytes a second
            sock.sendall(body[offset : offset + 625])
            time.sleep(0.25)
        assert time.monotonic() - started > 2
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_to_end(sock)
    first, _, second = answer.partition(b"HTTP/1.1 200 OK")[2].partition(b"HTTP/1.1 ")
    assert b'"shape":[1,10]' in first, answer[:300]
    assert second.startswith(b"200 OK")


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"HELLO\x00 / HTTP/1.1\r\n\r\n",
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".encode(),
    ],
    ids=["header name", "request line", "chunk size"],
)
def test_a_request_that_does_not_parse_is_a_json_400(
    server: ServerProcess, request_: bytes
) -> None:
    before = metric(server, REFUSALS, protocol="http", reason="malformed")
    with _connect(server.http_port) as sock:
        sock.sendall(request_)
        answer = _read_to_end(sock)
    assert "malformed" in _json_error(answer, 400)
    assert metric(server, REFUSALS, protocol="http", reason="malformed") == before + 1


def test_a_half_sent_body_holds_the_stop_no_longer_than_the_exit_timeout() -> None:
    """A connection open at the stop is waited for, up to the exit timeout, as Triton waits
    for its clients; a request on it that never finishes arriving is then refused, after its
    one-second grace, and the server exits."""
    server = start_server(extra_args=["--shutdown-timeout", "3"])
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
            sock.sendall(head.encode() + b'{"inputs": [')
            time.sleep(0.3)  # the route is waiting for the rest
            started = time.monotonic()
            code = server.stop(timeout=20, clients_may_linger=True)
            seconds = time.monotonic() - started
            answer = _read_to_end(sock)
    finally:
        server.process.kill()  # a no-op once it has exited
    assert code == 0
    assert 3 <= seconds < 9
    assert _json_error(answer, 503) == "server is shutting down"


def test_a_body_finishing_after_the_stop_is_answered_and_the_stop_ends_with_it() -> None:
    """The client of a connection open at the stop finishes its request during the wait:
    it is answered, with the connection's close, and the stop does not wait on."""
    server = start_server(extra_args=["--shutdown-timeout", "30"])
    body = json.dumps(GOOD).encode()
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
            sock.sendall(head.encode() + body[:10])
            time.sleep(0.3)  # the route is waiting for the rest
            started = time.monotonic()
            server.process.send_signal(15)
            server.wait_for("shutting down: draining accepted requests", timeout=10)
            time.sleep(0.5)
            sock.sendall(body[10:])
            answer = _read_to_end(sock)
            code = server.stop(timeout=20, clients_may_linger=True)
            seconds = time.monotonic() - started
    finally:
        server.process.kill()
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b"\r\nconnection: close" in head_bytes
    assert json.loads(payload)["outputs"][0]["shape"] == [1, 10]
    assert code == 0
    assert seconds < 10
