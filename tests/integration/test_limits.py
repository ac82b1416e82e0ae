"""Limits a client cannot push the server past, over both protocols: the request head,
methods and routes, counts of tensors, JSON depth, and the labels of the metrics.

Each refusal is fast, has its status and a message, and the next good request is still
answered correctly (the pattern of test_bad_requests.py, which covers the payloads).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.server import ServerProcess


@pytest.fixture(scope="module")
def server(server_either_way: ServerProcess) -> ServerProcess:
    """Every test here against one process and against two workers."""
    return server_either_way


IMAGE = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17
GOOD = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": IMAGE.ravel().tolist()}
INFER = "/v2/models/digits_cnn/infer"
FAST_SECONDS = 2.0
"""Longest a refusal may take: it must come before any work is done, even on a busy machine."""


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _assert_good(server: ServerProcess) -> None:
    """A fresh connection still gets a correct answer over both protocols."""
    response = httpx.post(f"http://{server.http_url}{INFER}", json={"inputs": [GOOD]}, timeout=30)
    assert response.status_code == 200, response.text
    http_logits = np.array(response.json()["outputs"][0]["data"], dtype=np.float32)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(_grpc_request(), timeout=30)
    grpc_logits = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
    assert http_logits.shape == (10,)
    np.testing.assert_allclose(grpc_logits, http_logits, rtol=1e-5, atol=1e-5)


def _grpc_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(IMAGE.tobytes())
    return request


# the request head -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({"X-Big": "x" * 65536}, "bytes"),
        ({f"X-H{i}": "v" * 500 for i in range(90)}, "bytes"),
        ({f"X-H{i}": "v" for i in range(101)}, "headers"),
    ],
    ids=["64 KiB header", "90 headers of 500 bytes", "101 headers"],
)
def test_an_oversized_head_is_431(
    server: ServerProcess, headers: dict[str, str], fragment: str
) -> None:
    started = time.monotonic()
    response = httpx.get(f"http://{server.http_url}/v2/health/ready", headers=headers, timeout=30)
    seconds = time.monotonic() - started
    assert response.status_code == 431, response.text
    assert fragment in response.json()["error"]
    assert response.headers["connection"] == "close"
    assert seconds < FAST_SECONDS
    _assert_good(server)


def _endless_line(server: ServerProcess, opening: bytes) -> tuple[bytes, int]:
    """Send ``opening``, then a line that never ends, 16 KiB at a time until the server
    answers (it must long before 8 MiB): its answer and the bytes of the line sent."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(opening)
        sent = 0
        try:
            while sent < 8 * 1024 * 1024 and not select.select([sock], [], [], 0.005)[0]:
                sock.sendall(b"x" * 16384)
                sent += 16384
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, sent


def test_a_header_line_that_never_ends_is_431_before_it_is_whole(server: ServerProcess) -> None:
    answer, sent = _endless_line(server, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Endless: ")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'{"error":' in answer
    assert sent < 1024 * 1024, f"the server read {sent} bytes of one header line"
    _assert_good(server)


def test_a_trailer_line_that_never_ends_is_431_before_it_is_whole(server: ServerProcess) -> None:
    """A chunked body's trailers are header lines: before they were limited, 8 MiB of one
    held the event loop for seconds (httptools joins a value's pieces with ``bytes +=``)."""
    body = b'{"inputs": []}'
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    answer, sent = _endless_line(server, head + b"%x\r\n%s\r\n0\r\nX-Endless: " % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"trailers" in answer
    assert sent < 1024 * 1024, f"the server read {sent} bytes of one trailer line"
    _assert_good(server)


def test_a_body_of_a_byte_a_chunk_is_refused_at_tritons_count_of_chunks(
    server: ServerProcess,
) -> None:
    """Every chunk costs the parser's callbacks: 4 MiB sent a byte a chunk (24 MiB on the
    wire) took 10.9 s of the server's CPU, and a 64 MiB body would take minutes. Triton stops
    at 65,536 non-empty chunks; so does batchserve, in Triton's words. httpx sends each piece
    a generator yields as one chunk."""

    def one_byte_chunks() -> Iterator[bytes]:
        for _ in range(4 * 1024 * 1024):
            yield b"x"

    started = time.monotonic()
    answer = httpx.post(f"http://{server.http_url}{INFER}", content=one_byte_chunks(), timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "error": "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or "
        "larger HTTP chunks."
    }
    assert time.monotonic() - started < 10
    _assert_good(server)


def test_large_but_reasonable_heads_are_served(http: httpx.Client) -> None:
    """A 16 KiB token among 60 headers is well inside the limits."""
    headers = {"Authorization": "Bearer " + "t" * 16384, **{f"X-H{i}": "v" for i in range(60)}}
    response = http.post(INFER, json={"inputs": [GOOD]}, headers=headers)
    assert response.status_code == 200, response.text


# methods and routes -----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["TRACE", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize(
    ("path", "allowed"),
    [(INFER, "POST"), ("/v2/health/ready", "GET")],
)
def test_an_unsupported_method_is_405(
    server: ServerProcess, http: httpx.Client, method: str, path: str, allowed: str
) -> None:
    response = http.request(method, path, content=b"{}")
    assert response.status_code == 405, response.text
    assert response.json()["error"]
    assert allowed in response.headers["allow"]
    _assert_good(server)


@pytest.mark.parametrize(
    "method",
    ["/inference.GRPCInferenceService/ModelDelete", "/inference.Nope/ModelInfer", "/x/y"],
)
def test_an_unknown_grpc_method_is_unimplemented(
    server: ServerProcess, channel: grpc.Channel, method: str
) -> None:
    call = channel.unary_unary(method)
    with pytest.raises(grpc.RpcError) as error:
        call(b"\x0a\x02hi", timeout=30)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    _assert_good(server)


# counts of tensors ------------------------------------------------------------------------
MANY = 10_000


def _outputs(names: list[str]) -> dict[str, object]:
    return {"inputs": [GOOD], "outputs": [{"name": name} for name in names]}


def _inputs(names: list[str]) -> dict[str, object]:
    return {"inputs": [{**GOOD, "name": name} for name in names]}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (_outputs([f"o{i}" for i in range(MANY)]), "outputs"),
        (_outputs(["logits"] * MANY), "outputs"),
        (_inputs([f"i{i}" for i in range(MANY)]), "inputs"),
        (_inputs(["image"] * MANY), "inputs"),
    ],
    ids=["outputs", "same output", "inputs", "same input"],
)
def test_http_thousands_of_tensors_are_400(
    server: ServerProcess, http: httpx.Client, body: dict[str, object], fragment: str
) -> None:
    started = time.monotonic()
    response = http.post(INFER, json=body)
    seconds = time.monotonic() - started
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
    assert str(MANY) in response.json()["error"]
    assert seconds < FAST_SECONDS
    _assert_good(server)


def _many_outputs(distinct: bool) -> service_pb2.ModelInferRequest:
    request = _grpc_request()
    for i in range(MANY):
        request.outputs.add(name=f"o{i}" if distinct else "logits")
    return request


def _many_inputs(distinct: bool) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    for i in range(MANY):
        request.inputs.add(
            name=f"i{i}" if distinct else "image", datatype="FP32", shape=[1, 1, 8, 8]
        )
        request.raw_input_contents.append(IMAGE.tobytes())
    return request


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (_many_outputs(True), "outputs"),
        (_many_outputs(False), "outputs"),
        (_many_inputs(True), "inputs"),
        (_many_inputs(False), "inputs"),
    ],
    ids=["outputs", "same output", "inputs", "same input"],
)
def test_grpc_thousands_of_tensors_are_invalid_argument(
    server: ServerProcess,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    request_: service_pb2.ModelInferRequest,
    fragment: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request_, timeout=30)
    seconds = time.monotonic() - started
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in error.value.details()
    assert str(MANY) in error.value.details()
    assert seconds < FAST_SECONDS
    _assert_good(server)


@pytest.mark.parametrize(
    ("field", "fragment"),
    [(b"\x2a\x00", "fields"), (b"\x22\x00", "fields"), (b"\x3a\x00", "raw_input_contents")],
    ids=["empty inputs", "empty parameters", "empty raw contents"],
)
def test_grpc_millions_of_empty_fields_are_refused_unparsed(
    server: ServerProcess, channel: grpc.Channel, field: bytes, fragment: str
) -> None:
    """Protobuf builds an object for each field: 16 M empty inputs in 32 MiB held the server
    for 15.7 s and 1.6 GiB before their count was refused. Here 8 M in 16 MiB."""
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=bytes,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    message = b"\x0a\x0adigits_cnn" + field * (8 << 20)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        infer(message, timeout=60)
    seconds = time.monotonic() - started
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in error.value.details()
    assert seconds < FAST_SECONDS
    _assert_good(server)


@pytest.mark.parametrize(
    ("method", "field", "code"),
    [
        ("ServerLive", b"\x78\x00", grpc.StatusCode.RESOURCE_EXHAUSTED),  # unknown fields
        ("LogSettings", b"\x0a\x00", grpc.StatusCode.RESOURCE_EXHAUSTED),  # settings entries
        ("RepositoryModelLoad", b"\x1a\x00", grpc.StatusCode.INVALID_ARGUMENT),  # parameters
    ],
    ids=["ServerLive", "LogSettings", "RepositoryModelLoad"],
)
def test_grpc_calls_other_than_inference_are_measured_before_they_are_read(
    server: ServerProcess, channel: grpc.Channel, method: str, field: bytes, code: grpc.StatusCode
) -> None:
    """grpc reads a call's message before its handler checks a token or model control: two
    32 MiB LogSettings messages of empty entries held the server for 3.6 s and 880 MiB."""
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=bytes,
        response_deserializer=bytes,
    )
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        call(field * (8 << 20), timeout=60)
    seconds = time.monotonic() - started
    assert error.value.code() == code, error.value.details()
    assert method in error.value.details()
    assert seconds < FAST_SECONDS
    _assert_good(server)


# JSON depth -------------------------------------------------------------------------------
DEPTH = 100_000
HEAD = b'{"inputs":[{"name":"image","datatype":"FP32","shape":[1,1,8,8],'


def _nested(opening: bytes, closing: bytes, inner: bytes = b"1") -> bytes:
    return opening * DEPTH + inner + closing * DEPTH


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (INFER, HEAD + b'"data":' + _nested(b"[", b"]") + b"}]}"),
        (INFER, HEAD + b'"data":[1],"parameters":' + _nested(b'{"a":', b"}") + b"}]}"),
        (INFER, b'{"inputs":[],"x":' + _nested(b"[", b"]", b"") + b"}"),
        (INFER, _nested(b"[", b"]", b"")),
        ("/v2/repository/index", _nested(b"[", b"]", b"")),
    ],
    ids=["in data", "in parameters", "in an unknown key", "the whole body", "repository index"],
)
def test_json_nested_100_000_deep_is_400(
    server: ServerProcess, http: httpx.Client, path: str, body: bytes
) -> None:
    started = time.monotonic()
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    seconds = time.monotonic() - started
    assert response.status_code == 400, response.text
    assert "depth" in response.json()["error"]
    assert seconds < FAST_SECONDS
    _assert_good(server)


# metric labels ----------------------------------------------------------------------------
def _series(server: ServerProcess) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every series on the metrics port: name and labels, without values."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_unknown_models_and_versions_never_become_metric_labels(
    server: ServerProcess, http: httpx.Client, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    _assert_good(server)  # every series a good request creates exists before we count
    before = _series(server)
    names = [f"ghost{i}x" for i in range(40)]
    versions = [str(9000 + i) for i in range(40)]
    for name, version in zip(names, versions, strict=True):
        assert http.post(f"/v2/models/{name}/infer", json={"inputs": [GOOD]}).status_code == 404
        assert http.get(f"/v2/models/{name}/ready").status_code == 404
        assert http.get(f"/v2/models/{name}/stats").status_code == 400  # Triton's INVALID_ARG
        path = f"/v2/models/digits_cnn/versions/{version}"
        assert http.post(f"{path}/infer", json={"inputs": [GOOD]}).status_code == 404
        assert http.get(f"{path}/stats").status_code == 400
        request = _grpc_request()
        request.model_name = name
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request, timeout=30)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError):
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name), timeout=30)
    after = _series(server)

    labels = {value for _, pairs in after for _, value in pairs}
    assert not [value for value in labels if "ghost" in value or value in versions]
    assert after == before, sorted(after ^ before)
