"""Triton's HTTP limits as its own QA suite exercises them (``L0_http``): the input size
limit (``http_input_size_limit_test.py``), with the server started with
``--http-max-input-size`` and bodies just over and just under it sent with requests and
tritonclient, and shapes whose element count or byte size overflow 64 bits
(``http_test.py``'s buffer size test); the texts are those Triton's tests look for. A body
over the limit is 413 where Triton answers 400: it is too large, and HTTP has a status that
says so."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import orjson
import pytest
import requests
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, start_server

LIMIT = 1 << 20
"""The server's --http-max-input-size: 1 MiB, so bodies around it are cheap to send."""
ELEMENTS = LIMIT // 4
"""FP32 elements in LIMIT bytes."""
OFFSET = 32
"""Elements just over or under the limit, as Triton's test has them."""
MODEL = "onnx_zero_1_float32"
RAISE_IT = "Use --http-max-input-size to increase the limit."

CONFIG = """name: "onnx_zero_1_float32"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
"""Triton QA's identity model: FP32 of any length, batched."""


def _identity() -> onnx.ModelProto:
    shape: list[str | int] = ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        MODEL,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("size_limit_repo")
    (root / MODEL / "1").mkdir(parents=True)
    onnx.save(_identity(), root / MODEL / "1" / "model.onnx")
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    process = start_server(root, ["--http-max-input-size", str(LIMIT)])
    yield process
    process.stop()


def _url(server: ServerProcess, route: str = "infer") -> str:
    return f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/{route}"


def _json_body(elements: int) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, elements],
                        "data": [1.0] * elements}]}  # fmt: skip


def _assert_json_size_text(error: str, size: str) -> None:
    assert error == (
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {LIMIT} "
        f"bytes. {RAISE_IT}"
    )


def test_a_raw_binary_input_over_the_limit_gets_tritons_text(server: ServerProcess) -> None:
    headers = {"Inference-Header-Content-Length": "0"}
    over = np.ones(ELEMENTS + OFFSET, np.float32).tobytes()
    refused = requests.post(_url(server), data=over, headers=headers, timeout=30)
    assert refused.status_code == 413
    assert refused.json()["error"] == (
        f"Raw input has a byte_size ({len(over)} bytes) that exceeds the maximum allowed value "
        f"of {LIMIT} bytes. {RAISE_IT}"
    )
    under = np.arange(ELEMENTS - OFFSET, dtype=np.float32)
    answered = requests.post(_url(server), data=under.tobytes(), headers=headers, timeout=30)
    assert answered.status_code == 200, answered.text
    header_size = int(answered.headers["Inference-Header-Content-Length"])
    np.testing.assert_array_equal(np.frombuffer(answered.content[header_size:], np.float32), under)


def test_a_json_body_over_the_limit_gets_tritons_text(server: ServerProcess) -> None:
    over = _json_body(ELEMENTS + OFFSET)
    body = orjson.dumps(over)
    refused = requests.post(_url(server), data=body, timeout=30)
    assert refused.status_code == 413
    _assert_json_size_text(refused.json()["error"], str(len(body)))
    elements = (ELEMENTS - OFFSET) * 4 // 5  # as Triton's test: about 5 bytes an element
    under = _json_body(elements)
    assert len(orjson.dumps(under)) < LIMIT
    answered = requests.post(_url(server), json=under, timeout=30)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == [1.0] * elements


def test_a_chunked_json_body_is_refused_at_the_size_counted(server: ServerProcess) -> None:
    """No Content-Length: the body is refused once the bytes received pass the limit, so
    its size is a lower bound."""
    piece = b" " * (64 * 1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(32):
            yield piece

    refused = requests.post(_url(server), data=chunks(), timeout=30)
    assert refused.status_code == 413
    error = refused.json()["error"]
    counted = int(error.removeprefix("request JSON size of at least ").split(" ")[0])
    assert LIMIT < counted < 32 * len(piece)  # refused before the body ended
    _assert_json_size_text(error, f"at least {counted}")


def test_generate_over_the_limit_gets_tritons_text(server: ServerProcess) -> None:
    """Triton's test sends base64 data that would grow once typed; the JSON itself is over
    the limit first."""
    data = base64.b64encode(np.ones(LIMIT, np.int8).tobytes()).decode()
    payload = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, LIMIT // 4],
                           "data": data}]}  # fmt: skip
    body = orjson.dumps(payload)
    refused = requests.post(_url(server, "generate"), data=body, timeout=30)
    assert refused.status_code == 413
    error = refused.json()["error"]
    assert error.startswith("request JSON size of ")
    assert f" bytes exceeds the maximum allowed input size of {LIMIT} bytes. " in error
    assert error.endswith(RAISE_IT)


def test_a_body_over_the_limit_once_decompressed_gets_tritons_text(
    server: ServerProcess,
) -> None:
    bomb = gzip.compress(b" " * (4 * LIMIT))
    assert len(bomb) < LIMIT // 64
    refused = requests.post(
        _url(server), data=bomb, headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert refused.status_code == 413
    assert refused.json()["error"] == (
        f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {RAISE_IT}"
    )


def test_tritonclient_reads_the_limit_for_binary_and_json_inputs(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    over = np.ones((1, ELEMENTS + OFFSET), np.float32)
    for binary in (True, False):
        tensor = httpclient.InferInput("INPUT0", list(over.shape), "FP32")
        tensor.set_data_from_numpy(over, binary_data=binary)
        with pytest.raises(InferenceServerException) as refusal:
            client.infer(MODEL, [tensor])
        assert refusal.value.status() == "413"
        opening = "request size of " if binary else "request JSON size of "
        assert refusal.value.message().startswith(opening)
        assert f"exceeds the maximum allowed input size of {LIMIT} bytes. " in (
            refusal.value.message()
        )
    under = np.arange(ELEMENTS // 2, dtype=np.float32).reshape(1, -1)
    tensor = httpclient.InferInput("INPUT0", list(under.shape), "FP32")
    tensor.set_data_from_numpy(under)
    result = client.infer(MODEL, [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), under)
    client.close()


@pytest.mark.parametrize(
    ("shape", "opening"),
    [
        ([2**4, 2**60 + 2], "invalid shape for input 'INPUT0': shape [16, 1152921504606846978] "
         "causes total element count to exceed maximum size of 9223372036854775807"),
        ([2**2, 2**60 + 2], "byte size overflow for input 'INPUT0': element count "
         "(4611686018427387912) * data type size (4) exceeds maximum allowed size "
         "(9223372036854775807)"),
    ],
    ids=["element-count", "byte-size"],
)  # fmt: skip
def test_a_shape_overflowing_64_bits_gets_tritons_text(
    server: ServerProcess, shape: list[int], opening: str
) -> None:
    payload = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
    refused = requests.post(_url(server), json=payload, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(opening)


def test_a_negative_dimension_gets_tritons_http_text(server: ServerProcess) -> None:
    """Triton's HTTP front end reads a shape as unsigned integers (``http_test.py``'s
    negative-dimension test, which also sees Triton answer 500: here it is the client's
    mistake, 400)."""
    payload = {"inputs": [{"name": "INPUT0", "shape": [2, -5], "datatype": "FP32", "data": [1.0]}]}
    refused = requests.post(_url(server), json=payload, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    )


def test_nan_and_infinity_travel_in_json_as_in_triton(server: ServerProcess) -> None:
    """L0_nan_inf over raw HTTP: Python's json.dumps writes NaN and Infinity, Triton reads
    them, and answers them in JSON as the same words. The request used to be malformed JSON,
    and the output was switched to binary data, which ``.json()`` of the answer cannot
    read. tritonclient's JSON tensors carry them the same way."""
    values = [float("nan"), float("inf"), float("-inf"), 1.0, -0.5]
    payload = {"inputs": [{"name": "INPUT0", "shape": [1, 5], "datatype": "FP32", "data": values}]}
    answer = requests.post(_url(server), data=json.dumps(payload), timeout=30)
    assert answer.status_code == 200, answer.text
    assert "inference-header-content-length" not in answer.headers
    assert b'"data":[NaN,Infinity,-Infinity,1.0,-0.5]' in answer.content
    (output,) = answer.json()["outputs"]
    assert np.array_equal(np.array(output["data"]), np.array(values), equal_nan=True)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    tensor = httpclient.InferInput("INPUT0", [1, 5], "FP32")
    tensor.set_data_from_numpy(np.array([values], np.float32), binary_data=False)
    result = client.infer(
        MODEL, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    assert np.array_equal(
        result.as_numpy("OUTPUT0"), np.array([values], np.float32), equal_nan=True
    )
