"""The real server reads a chunked inference body that also declares a Content-Length by its
chunks, answers it, and closes the connection (RFC 9112, section 6.1), as Triton does for its
L0_http ``test_content_encoding_chunked_manually``; what was pipelined behind it is not read
as a request. A body whose last transfer coding is not chunked is refused at once."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess
from tests.integration.test_upgrade_offers import BODY, INFER, _exchange, _logits

BEHIND = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="module")
def server(server_either_way: ServerProcess) -> ServerProcess:
    """Every test here against one process and against two workers."""
    return server_either_way


def _chunked(body: bytes, piece: int = 1000) -> bytes:
    chunks = [body[start : start + piece] for start in range(0, len(body), piece)]
    return b"".join(b"%X\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


def test_a_chunked_body_with_a_content_length_is_answered_then_the_connection_closed(
    server: ServerProcess,
) -> None:
    """As Python's ``requests`` sends it when a caller sets ``Transfer-Encoding: chunked`` on a
    body of bytes: the length counts the chunked encoding; here also one of 16 bytes, which
    would end the body inside its first chunk."""
    plain = httpx.post(f"http://{server.http_url}{INFER}", content=BODY, timeout=30)
    assert plain.status_code == 200, plain.text
    encoded = _chunked(BODY)
    for length in (len(encoded), 16):
        head = b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n" % INFER.encode()
        request = head + b"Content-Length: %d\r\n\r\n" % length + encoded
        bodies, closed = _exchange(server, request + BEHIND, answers=2)
        assert [body[:4] for body in bodies] == [b"200 "], bodies
        np.testing.assert_array_equal(_logits(bodies[0][4:]), _logits(plain.content))
        assert closed


def test_requests_with_a_chunked_header_on_bytes_is_answered_as_triton_answers_it(
    server: ServerProcess,
) -> None:
    """Triton's L0_http ``test_content_encoding_chunked_manually``, as it calls the server:
    Python's ``requests`` given a chunk-encoded body of bytes and ``Transfer-Encoding:
    chunked`` adds a Content-Length of the encoded bytes. A raw binary input (a header of 0
    bytes) comes back from the model; tritonclient's next request is served as usual."""
    image = (np.arange(64, dtype=np.float32) % 7).reshape(1, 1, 8, 8)
    answer = requests.post(
        f"http://{server.http_url}{INFER}",
        data=_chunked(image.tobytes(), piece=100),
        headers={"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.request.headers["Content-Length"] == str(len(_chunked(image.tobytes(), 100)))
    assert answer.headers["connection"] == "close"
    header = json.loads(answer.content[: int(answer.headers["Inference-Header-Content-Length"])])
    assert [output["name"] for output in header["outputs"]] == ["logits", "probabilities"]
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 40
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
        tensor.set_data_from_numpy(image)
        expected = client.infer("digits_cnn", [tensor]).as_numpy("logits")
    finally:
        client.close()
    offset = int(answer.headers["Inference-Header-Content-Length"])
    logits = np.frombuffer(answer.content[offset : offset + 40], dtype=np.float32)
    np.testing.assert_array_equal(logits, expected.reshape(-1))


def test_a_body_whose_last_transfer_coding_is_not_chunked_is_refused(
    server: ServerProcess,
) -> None:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n" % INFER.encode()
    bodies, closed = _exchange(server, head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY, 1)
    assert [body[:4] for body in bodies] == [b"400 "], bodies
    assert closed
    bodies, _ = _exchange(server, BEHIND, answers=1)
    assert bodies == [b'200 {"ready":true}']
