"""KServe's own Python SDK (``InferenceRESTClient``, ``InferenceGRPCClient``) against a real
server, one process and two workers: health, readiness, inference with JSON, binary, raw and
typed-contents tensors, BYTES tensors, and the errors it raises for bad requests.

The SDK runs in a process of its own (``kserve_calls``); see there why. It reports what it
sent and what it got back; this module computes what should have come back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.integration.server import MODEL_REPO, ServerProcess, start_server
from tests.integration.shm_models import write_simple_models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def calls(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """Every call of ``kserve_calls``, made once against a fresh server."""
    repo = write_simple_models(tmp_path_factory.mktemp("kserve_repo"))
    shutil.copytree(MODEL_REPO / "digits_cnn", repo / "digits_cnn")
    server = start_server(repo, ["--workers", request.param])
    try:
        yield _run_sdk(server)
    finally:
        assert server.stop() == 0


def _run_sdk(server: ServerProcess) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.integration.kserve_calls"]
    addresses = json.dumps({"http": f"http://{server.http_url}", "grpc": server.grpc_url})
    done = subprocess.run(
        command, input=addresses, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _array(tensor: dict[str, Any], dtype: type) -> np.ndarray:
    return np.array(tensor["data"], dtype=dtype).reshape(tensor["shape"])


def _digits_expected(image: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(MODEL_REPO / "digits_cnn" / "1" / "model.onnx"))
    logits, probabilities = session.run(None, {"image": image})
    return {"logits": logits, "probabilities": probabilities}


def _result(call: dict[str, Any]) -> Any:
    assert "result" in call, call.get("error")
    return call["result"]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_health_and_readiness(calls: dict[str, Any], protocol: str) -> None:
    side = calls[protocol]
    assert _result(side["live"]) is True
    assert _result(side["ready"]) is True
    assert _result(side["model_ready"]) is True


def test_unknown_model_is_not_ready(calls: dict[str, Any]) -> None:
    # The REST client reads any status but 2xx as "not ready".
    assert _result(calls["rest"]["unknown_model_ready"]) is False
    # Triton answers ModelReady for a model it has never heard of with ready=false, no error.
    assert _result(calls["grpc"]["unknown_model_ready"]) is False


BOTH = ["logits", "probabilities"]


@pytest.mark.parametrize(
    ("protocol", "name", "outputs", "request_id", "binary"),
    [
        ("rest", "digits_json", BOTH, "rest-json", False),
        # one output asked for, as binary data: only that one comes back, after the JSON
        ("rest", "digits_binary", ["probabilities"], "rest-binary", True),
        # the request's binary_data_output parameter: every output after the JSON
        ("rest", "digits_binary_outputs", BOTH, "rest-binary-outputs", True),
        ("grpc", "digits_raw", BOTH, "grpc-raw", None),
        ("grpc", "digits_contents", BOTH, "grpc-contents", None),
    ],
)
def test_digits_match_in_process_onnxruntime(
    calls: dict[str, Any],
    protocol: str,
    name: str,
    outputs: list[str],
    request_id: str,
    binary: bool | None,
) -> None:
    call = calls[protocol][name]
    image = _array(call["sent"]["image"], np.float32)
    result = _result(call)
    assert result["id"] == request_id
    assert result["model_name"] == "digits_cnn"
    assert sorted(result["outputs"]) == outputs
    assert result.get("binary_outputs") is binary
    expected = _digits_expected(image)
    for output in outputs:
        got = result["outputs"][output]
        assert got["datatype"] == "FP32"
        assert got["shape"] == [image.shape[0], 10]
        np.testing.assert_allclose(_array(got, np.float32), expected[output], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("protocol", "name"), [("rest", "simple_binary"),
                                                ("grpc", "simple_contents")])  # fmt: skip
def test_int32_sum_and_difference(calls: dict[str, Any], protocol: str, name: str) -> None:
    call = calls[protocol][name]
    a = _array(call["sent"]["INPUT0"], np.int32)
    b = _array(call["sent"]["INPUT1"], np.int32)
    outputs = _result(call)["outputs"]
    assert outputs["OUTPUT0"]["datatype"] == "INT32"
    np.testing.assert_array_equal(_array(outputs["OUTPUT0"], np.int32), a + b)
    np.testing.assert_array_equal(_array(outputs["OUTPUT1"], np.int32), a - b)


@pytest.mark.parametrize(("protocol", "name"), [
    ("rest", "strings_json"), ("rest", "strings_binary"),
    ("grpc", "strings_raw"), ("grpc", "strings_contents"),
])  # fmt: skip
def test_bytes_tensors(calls: dict[str, Any], protocol: str, name: str) -> None:
    call = calls[protocol][name]
    a = _array(call["sent"]["INPUT0"], np.int64)
    b = _array(call["sent"]["INPUT1"], np.int64)
    outputs = _result(call)["outputs"]
    for output, expected in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        assert outputs[output]["datatype"] == "BYTES"
        assert outputs[output]["shape"] == [1, 16]
        assert outputs[output]["data"] == [str(v) for v in expected.reshape(-1)]


@pytest.mark.parametrize(
    ("call", "triton_text"),
    [
        ("wrong_shape",
         "unexpected shape for input 'image' for model 'digits_cnn'. Expected [-1,1,8,8], "
         "got [1,1,8,7]"),
        ("wrong_datatype",
         "inference input 'image' data-type is 'INT32', but model 'digits_cnn' expects 'FP32'"),
    ],
)  # fmt: skip
def test_a_bad_tensor_is_a_client_error_in_tritons_words(
    calls: dict[str, Any], call: str, triton_text: str
) -> None:
    rest = calls["rest"][call]["error"]
    assert rest["status"] == 400
    grpc = calls["grpc"][call]["error"]
    assert grpc["status"] == "INVALID_ARGUMENT"
    for message in (rest["message"], grpc["message"]):  # Triton's text first
        assert message.startswith(triton_text)


def test_unknown_model_is_refused(calls: dict[str, Any]) -> None:
    rest = calls["rest"]["unknown_model"]["error"]
    assert rest["status"] == 404
    grpc = calls["grpc"]["unknown_model"]["error"]
    assert grpc["status"] == "NOT_FOUND"
    for message in (rest["message"], grpc["message"]):
        assert message.startswith("Request for unknown model: 'no_such_model' is not found")
