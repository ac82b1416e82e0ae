"""Requests wrong in every way a client can get them wrong, over both protocols.

Each gets its status and a message naming the problem, and the next good request is
still answered correctly.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess

INVALID_HTTP = "Invalid HTTP request received."  # uvicorn's warning


@pytest.fixture(scope="module")
def server(server_either_way: ServerProcess) -> ServerProcess:
    """Every test here against one process and against two workers."""
    return server_either_way


GOOD_IMAGE = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17


def _json_input(**overrides: object) -> dict[str, object]:
    tensor: dict[str, object] = {
        "name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
        "data": GOOD_IMAGE.ravel().tolist(),
    }  # fmt: skip
    tensor.update(overrides)
    return {"inputs": [tensor]}


def _binary(
    header: dict[str, object], payload: bytes, length: int | None = None
) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header)
    return head + payload, {
        "Inference-Header-Content-Length": str(len(head) if length is None else length)
    }


HTTP_CASES: list[tuple[str, str, object, dict[str, str], int, str]] = [
    ("unknown model", "/v2/models/nope/infer", _json_input(), {}, 404, "nope"),
    ("unknown version", "/v2/models/digits_cnn/versions/9/infer", _json_input(), {}, 404, "9"),
    ("version not digits 0-9", "/v2/models/digits_cnn/versions/%C2%B2/infer", _json_input(), {}, 400, "failed to get model version from specified version string '\u00b2'"),
    ("malformed JSON", "/v2/models/digits_cnn/infer", b'{"inputs":[', {}, 400, "JSON"),
    ("name not a string", "/v2/models/digits_cnn/infer", _json_input(name=5), {}, 400, "name"),
    ("shape not a list", "/v2/models/digits_cnn/infer", _json_input(shape="1,1,8,8"), {}, 400, "shape"),
    ("unknown datatype", "/v2/models/digits_cnn/infer", _json_input(datatype="FP33"), {}, 400, "FP33"),
    ("wrong datatype", "/v2/models/digits_cnn/infer", _json_input(datatype="INT64", data=[0] * 64), {}, 400, "inference input 'image' data-type is 'INT64', but model 'digits_cnn' expects 'FP32'"),
    ("wrong dims", "/v2/models/digits_cnn/infer", _json_input(shape=[1, 1, 8, 7], data=[0.0] * 56), {}, 400, "image"),
    ("negative dim", "/v2/models/digits_cnn/infer", _json_input(shape=[1, -1, 8, 8]), {}, 400, "image"),
    ("boolean dim", "/v2/models/digits_cnn/infer", _json_input(shape=[True, 1, 8, 8]), {}, 400, "image"),
    ("overflowing shape", "/v2/models/digits_cnn/infer", _json_input(shape=[2**32, 2**32, 1, 1]), {}, 400, "image"),
    ("data count", "/v2/models/digits_cnn/infer", _json_input(data=[1.0] * 63), {}, 400, "image"),
    ("deep nesting", "/v2/models/digits_cnn/infer", _json_input(data=orjson.loads(b"[" * 101 + b"1.0," * 63 + b"1.0" + b"]" * 101)), {}, 400, "JSON nesting depth exceeds maximum allowed limit (100) (batchserve: tensor 'image'"),
    ("missing input", "/v2/models/digits_cnn/infer", {"inputs": []}, {}, 400, "input"),
    ("extra input", "/v2/models/digits_cnn/infer",
     {"inputs": [_json_input()["inputs"][0], {**_json_input()["inputs"][0], "name": "other"}]}, {}, 400, "other"),  # type: ignore[index]
    ("unknown output", "/v2/models/digits_cnn/infer", {**_json_input(), "outputs": [{"name": "nope"}]}, {}, 400, "unexpected inference output 'nope' for model 'digits_cnn'"),
    ("reserved parameter", "/v2/models/digits_cnn/infer", {**_json_input(), "parameters": {"triton_enable_empty_final_response": True}}, {}, 400,
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ("duplicate output", "/v2/models/digits_cnn/infer",
     {**_json_input(), "outputs": [{"name": "logits"}, {"name": "logits"}]}, {}, 400, "logits"),
    ("bad priority", "/v2/models/digits_cnn/infer", {**_json_input(), "parameters": {"priority": "high"}}, {}, 400, "priority"),
    ("traversal name", "/v2/models/%2e%2e%2f/infer", _json_input(), {}, 400, "name"),
    ("header length not a number", "/v2/models/digits_cnn/infer", b"{}", {"Inference-Header-Content-Length": "abc"}, 400, "Inference-Header-Content-Length"),
    ("header length past body", "/v2/models/digits_cnn/infer", b"{}", {"Inference-Header-Content-Length": "99999"}, 400, "Inference-Header-Content-Length"),
]  # fmt: skip


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


def _assert_good_http(http: httpx.Client) -> None:
    response = http.post("/v2/models/digits_cnn/infer", json=_json_input())
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 10]


@pytest.mark.parametrize(
    ("case", "path", "body", "headers", "status", "fragment"),
    HTTP_CASES,
    ids=[c[0] for c in HTTP_CASES],
)
def test_http_bad_request(
    http: httpx.Client,
    case: str,
    path: str,
    body: object,
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers=headers)
    else:
        response = http.post(path, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    _assert_good_http(http)


@pytest.mark.parametrize(
    ("case", "payload", "length_delta", "fragment"),
    [
        ("binary size past the body", GOOD_IMAGE.tobytes()[:100], 0, "image"),
        ("trailing bytes", GOOD_IMAGE.tobytes() + b"xx", 0, "bytes"),
        ("size does not match shape", GOOD_IMAGE.tobytes() + b"\0" * 8, 8, "image"),
    ],
)
def test_http_bad_binary_request(
    http: httpx.Client, case: str, payload: bytes, length_delta: int, fragment: str
) -> None:
    size = GOOD_IMAGE.nbytes + length_delta
    header = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                          "parameters": {"binary_data_size": size}}]}  # fmt: skip
    body, headers = _binary(header, payload)
    response = http.post("/v2/models/digits_cnn/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
    _assert_good_http(http)


def test_http_body_over_the_limit_is_413(http: httpx.Client) -> None:
    response = http.post("/v2/models/digits_cnn/infer", content=b" " * (17 * 1024 * 1024))
    assert response.status_code == 413
    _assert_good_http(http)


@pytest.mark.parametrize("coding", [b"gzip", b"identity", b"chunked, gzip"])
def test_a_transfer_coding_other_than_chunked_is_400(
    server: ServerProcess, http: httpx.Client, coding: bytes
) -> None:
    """The server decodes only chunked framing; any other coding (or chunked not last) leaves
    the body's length unknown, so the request is refused as malformed and the connection
    closed."""
    head = b"POST /v2/models/digits_cnn/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: "
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as sock:
        sock.sendall(head + coding + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        answer = sock.recv(65536)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), answer[:100]
    assert json.loads(body)["error"].startswith("malformed HTTP request")
    _assert_good_http(http)


def test_a_flood_of_malformed_requests_is_answered_each_and_logged_once(
    server: ServerProcess, http: httpx.Client
) -> None:
    """Triton's HTTP fuzz test sends 80,420 malformed request lines; each one used to write
    the same warning line (uvicorn's). Each is still answered; the log says it once per
    process (one per worker) in 10 s, and the next line reports how many it held back."""
    server.drain_logs()
    before = len(server.logs)
    for attempt in range(40):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as sock:
            sock.sendall(b"GET /v2/health/live\x00%d HTTP/1.1\r\n\r\n" % attempt)
            assert sock.recv(65536).startswith(b"HTTP/1.1 400 "), attempt
    _assert_good_http(http)
    server.drain_logs()
    warned = [i for i, r in enumerate(server.logs) if r.get("message") == INVALID_HTTP]
    assert warned, "the malformed requests are logged"  # here, or by a test < 10 s before
    assert len([i for i in warned if i >= before]) <= 2, server.logs[before:]


def test_a_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    """No Content-Length to refuse up front: the bytes are counted as they arrive."""

    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * (1024 * 1024)

    response = http.post("/v2/models/digits_cnn/infer", content=chunks())
    assert response.status_code == 413
    error = response.json()["error"]
    assert error.startswith("request JSON size of at least ")
    assert error.endswith(
        " bytes exceeds the maximum allowed input size of 16777216 bytes. Use "
        "--http-max-input-size to increase the limit."
    )
    _assert_good_http(http)


def test_a_binary_body_over_its_limit_is_413(http: httpx.Client) -> None:
    """A binary-extension body has its own, larger limit (64 MiB by default)."""
    header = b'{"inputs":[{"name":"image","datatype":"FP32","shape":[1,1,8,8]}]}'
    response = http.post(
        "/v2/models/digits_cnn/infer",
        content=header + b"\0" * (65 * 1024 * 1024),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 413
    assert response.json()["error"] == (
        f"request size of {len(header) + (65 << 20)} bytes exceeds the maximum allowed input "
        "size of 67108864 bytes. Use --http-max-input-size to increase the limit."
    )
    _assert_good_http(http)


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_request(**overrides: object) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(GOOD_IMAGE.tobytes())
    for key, value in overrides.items():
        if key == "raw":
            del request.raw_input_contents[:]
            request.raw_input_contents.extend(value)  # type: ignore[arg-type]
        elif key == "shape":
            del tensor.shape[:]
            tensor.shape.extend(value)  # type: ignore[arg-type]
        else:
            setattr(request if key.startswith("model_") else tensor, key, value)
    return request


GRPC_CASES = [
    ("unknown model", {"model_name": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
    ("unknown datatype", {"datatype": "FP33"}, grpc.StatusCode.INVALID_ARGUMENT, "FP33"),
    ("version not digits 0-9", {"model_version": "\u00b2"}, grpc.StatusCode.INVALID_ARGUMENT, "failed to get model version"),
    ("wrong datatype", {"datatype": "INT32", "raw": [GOOD_IMAGE.astype(np.int32).tobytes()]}, grpc.StatusCode.INVALID_ARGUMENT, "inference input 'image' data-type is 'INT32', but model 'digits_cnn' expects 'FP32'"),
    ("byte size", {"raw": [GOOD_IMAGE.tobytes() + b"\0" * 4]}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
    ("raw count", {"raw": [GOOD_IMAGE.tobytes()] * 2}, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
    ("no contents at all", {"raw": []}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
    ("wrong dims", {"shape": [1, 1, 4, 16]}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
    ("overflowing shape", {"shape": [2**32, 2**32, 1, 1]}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
    ("BYTES prefix past the end", {"datatype": "BYTES", "shape": [1], "raw": [struct.pack("<I", 99) + b"ab"]}, grpc.StatusCode.INVALID_ARGUMENT, "image"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "overrides", "code", "fragment"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES]
)
def test_grpc_bad_request(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, case: str, overrides: dict[str, object],
    code: grpc.StatusCode, fragment: str,
) -> None:  # fmt: skip
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(_grpc_request(**overrides))
    assert error.value.code() == code
    assert fragment in error.value.details()
    good = stub.ModelInfer(_grpc_request())
    assert list(good.outputs[0].shape) == [1, 10]
    assert len(good.raw_output_contents[0]) == 40


def test_grpc_message_over_the_limit_is_resource_exhausted(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    huge = _grpc_request(raw=[b"\0" * (65 * 1024 * 1024)])
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(huge)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.ModelInfer(_grpc_request()).outputs[0].name == "logits"


def test_grpc_health_and_reflection(server: ServerProcess) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(
            health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answer = next(iter(reflection.ServerReflectionInfo(iter([request]))))
        names = {s.name for s in answer.list_services_response.service}
        assert "inference.GRPCInferenceService" in names


@pytest.mark.parametrize(
    ("tokens", "lengths", "problem"),
    [
        (5, 6, "within 1..5, the length of the sequence sent; got 6..6"),
        (5, 0, "within 1..5, the length of the sequence sent; got 0..0"),
        (0, 1, "within 1..0, the length of the sequence sent; got 1..1"),
    ],
)
def test_a_sequence_length_past_the_sequence_sent_is_the_clients_mistake(
    http: httpx.Client,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    tokens: int,
    lengths: int,
    problem: str,
) -> None:
    """char_lstm's ``lengths`` input (its ``sequence_length_input``) past its tokens reached
    the model as an index past the end: ONNX Runtime's error, a 500 / INTERNAL."""
    body = {"inputs": [
        {"name": "tokens", "datatype": "INT64", "shape": [1, tokens], "data": [3] * tokens},
        {"name": "lengths", "datatype": "INT64", "shape": [1, 1], "data": [lengths]},
    ]}  # fmt: skip
    response = http.post("/v2/models/char_lstm/infer", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == f"input 'lengths': each sample's length must be {problem}"
    request = service_pb2.ModelInferRequest(model_name="char_lstm")
    request.inputs.add(name="tokens", datatype="INT64", shape=[1, tokens])
    request.inputs.add(name="lengths", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.extend(
        [np.full(tokens, 3, np.int64).tobytes(), np.int64(lengths).tobytes()]
    )
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in error.value.details()
    body["inputs"][1]["data"] = [max(tokens, 1)]  # type: ignore[index]
    body["inputs"][0].update(shape=[1, max(tokens, 1)], data=[3] * max(tokens, 1))  # type: ignore[index]
    assert http.post("/v2/models/char_lstm/infer", json=body).status_code == 200


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_gets_the_clients_mistakes_as_clients_mistakes(
    server: ServerProcess, protocol: str
) -> None:
    """What a Triton user calling through tritonclient sees: a version in other digits and a
    sequence length past the tokens are 400 / INVALID_ARGUMENT, never a 500 or a hang
    (sequences past what the memory budget holds: ``test_memory_budget.py``)."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    timeout = {} if protocol == "http" else {"client_timeout": 30}  # http: its own default
    image = module.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(GOOD_IMAGE)
    with pytest.raises(InferenceServerException) as version:
        client.infer("digits_cnn", [image], model_version="\u00b2", **timeout)
    tokens = module.InferInput("tokens", [1, 5], "INT64")
    tokens.set_data_from_numpy(np.full((1, 5), 3, np.int64))
    lengths = module.InferInput("lengths", [1, 1], "INT64")
    lengths.set_data_from_numpy(np.array([[6]], np.int64))
    with pytest.raises(InferenceServerException) as length:
        client.infer("char_lstm", [tokens, lengths], **timeout)
    refused = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert (version.value.status(), length.value.status()) == (refused, refused)
    # tritonclient's HTTP client puts the version in the URL unencoded: a request line that is
    # not ASCII, refused before any route (hand-built, %C2%B2 gets the version text: above)
    said = "failed to get model version" if protocol == "grpc" else "malformed HTTP request"
    assert said in version.value.message()
    assert "input 'lengths': each sample's length must be within 1..5" in length.value.message()
    assert client.infer("digits_cnn", [image]).as_numpy("logits").shape == (1, 10)
