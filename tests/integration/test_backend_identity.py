"""Identity models of each type, served as Triton's L0_backend_identity serves them: BF16
through ONNX Runtime (batchserve carries it as uint16, ORT wants bfloat16), and empty
outputs, which Triton answers without binary data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.integration.server import ServerProcess, start_server

TYPES = {"bf16": (TensorProto.BFLOAT16, "TYPE_BF16"), "fp32": (TensorProto.FLOAT, "TYPE_FP32")}
# normal, negative, largest finite, infinities, smallest subnormal, negative zero
BF16_VALUES = np.array(
    [[1.5, -0.1, 3.3895e38, np.inf, -np.inf, 9.2e-41, -0.0]], dtype=ml_dtypes.bfloat16
)


def _write_identity(repo: Path, name: str, element: int, config_type: str) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", element, ["N", "D"])],
        [helper.make_tensor_value_info("OUTPUT0", element, ["N", "D"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    tensor = 'name: "{}" data_type: ' + config_type + " dims: [ -1 ]"
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f"input [ {{ {tensor.format('INPUT0')} }} ]\n"
        f"output [ {{ {tensor.format('OUTPUT0')} }} ]\n"
    )


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("identity_repo")
    for name, (element, config_type) in TYPES.items():
        _write_identity(repo, name, element, config_type)
    server = start_server(repo)
    yield server
    assert server.stop() == 0


def test_bf16_identity_over_http_binary_is_bit_exact(identities: ServerProcess) -> None:
    tensor = httpclient.InferInput("INPUT0", list(BF16_VALUES.shape), "BF16")
    tensor.set_data_from_numpy(BF16_VALUES, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    with httpclient.InferenceServerClient(identities.http_url) as client:
        result = client.infer("bf16", [tensor], outputs=[output])
    assert result.get_output("OUTPUT0")["datatype"] == "BF16"
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), BF16_VALUES.view(np.uint16))


def test_bf16_identity_over_grpc_is_bit_exact(identities: ServerProcess) -> None:
    values = np.tile(BF16_VALUES, (3, 1))
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "BF16")
    tensor.set_data_from_numpy(values)
    with grpcclient.InferenceServerClient(identities.grpc_url) as client:
        result = client.infer("bf16", [tensor])
    assert result.get_output("OUTPUT0").datatype == "BF16"
    got = result.as_numpy("OUTPUT0")
    assert got.shape == values.shape
    np.testing.assert_array_equal(got.view(np.uint16), values.view(np.uint16))


def test_an_empty_binary_output_is_answered_as_plain_json(identities: ServerProcess) -> None:
    """Triton adds an output's binary data only when it has bytes; with none, the answer is
    JSON without Inference-Header-Content-Length (http_server.cc)."""
    request = {
        "inputs": [{"name": "INPUT0", "shape": [1, 0], "datatype": "FP32", "data": []}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    url = f"http://{identities.http_url}/v2/models/fp32/infer"
    answer = httpx.post(url, json=request, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in answer.headers
    assert answer.json()["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [1, 0],
            "parameters": {"binary_data_size": 0},
        }
    ]


@pytest.mark.parametrize("model", ["fp32", "bf16"])
def test_tritonclient_reads_an_empty_binary_output(identities: ServerProcess, model: str) -> None:
    empty = np.zeros((1, 0), np.float32 if model == "fp32" else ml_dtypes.bfloat16)
    tensor = httpclient.InferInput("INPUT0", [1, 0], model.upper())
    tensor.set_data_from_numpy(empty, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    with httpclient.InferenceServerClient(identities.http_url) as client:
        got = client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT0")
    assert (got.shape, got.dtype) == ((1, 0), empty.dtype)


def test_json_data_of_an_input_with_no_elements_is_ignored(identities: ServerProcess) -> None:
    """Triton never reads ``data`` when the shape has no elements, so accepts what it holds."""
    request = {"inputs": [{"name": "INPUT0", "shape": [1, 0], "datatype": "FP32", "data": [1.0]}]}
    url = f"http://{identities.http_url}/v2/models/fp32/infer"
    answer = httpx.post(url, json=request, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["shape"] == [1, 0]


@pytest.mark.parametrize(
    ("input_binary", "error"),
    [
        (False, "receiving BF16 data via JSON is not supported. Please use the binary data "
         "format for input INPUT0 (batchserve:"),
        (True, "sending BF16 data via JSON is not supported. Please use the binary data "
         "format for output (batchserve:"),
    ],
)  # fmt: skip
def test_bf16_over_json_is_refused_in_tritons_words(
    identities: ServerProcess, input_binary: bool, error: str
) -> None:
    """BF16 JSON input, then a BF16 output asked for as JSON: 400, Triton's text first."""
    bits = BF16_VALUES.view(np.uint16)
    tensor = {"name": "INPUT0", "shape": list(bits.shape), "datatype": "BF16"}
    output = {"name": "OUTPUT0", "parameters": {"binary_data": False}}
    headers, body = {}, b""
    if input_binary:
        tensor["parameters"] = {"binary_data_size": bits.nbytes}
        header = json.dumps({"inputs": [tensor], "outputs": [output]}).encode()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        body = header + bits.tobytes()
    else:
        tensor["data"] = [1.5] * bits.size
        body = json.dumps({"inputs": [tensor], "outputs": [output]}).encode()
    url = f"http://{identities.http_url}/v2/models/bf16/infer"
    answer = httpx.post(url, content=body, headers=headers, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(error)
