"""The classification extension through a real server and the real tritonclient, as
NVIDIA's image_client.py -c N asks for it, over HTTP (JSON and binary) and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, start_server

SCORES = np.array([[0.1, 0.7, 0.2, 0.7, 0.05], [9.0, -1.0, 3.5, 2.0, 3.5]], dtype=np.float32)
LABELS = "cat\ndog\n\nbird\n"  # four lines: index 2 has an empty label, index 4 none


def _model(inputs: list[Any], outputs: list[Any], nodes: list[Any]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _write(repo: Path, name: str, model: onnx.ModelProto, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config)


def write_scores(repo: Path, name: str = "scores") -> None:
    """Batching: y = x (FP32, labelled), n = INT32(x), h = FP16(x), each [batch, 5]."""
    value = helper.make_tensor_value_info
    model = _model(
        [value("x", TensorProto.FLOAT, ["batch", 5])],
        [
            value("y", TensorProto.FLOAT, ["batch", 5]),
            value("n", TensorProto.INT32, ["batch", 5]),
            value("h", TensorProto.FLOAT16, ["batch", 5]),
        ],
        [
            helper.make_node("Identity", ["x"], ["y"]),
            helper.make_node("Cast", ["x"], ["n"], to=TensorProto.INT32),
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
        ],
    )
    _write(
        repo,
        name,
        model,
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [5] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [5] label_filename: "labels.txt" },\n'
        '        { name: "n" data_type: TYPE_INT32 dims: [5] },\n'
        '        { name: "h" data_type: TYPE_FP16 dims: [5] }]\n',
    )
    (repo / name / "labels.txt").write_text(LABELS)


def write_flat(repo: Path) -> None:
    """No batching: y = x (FP64 [2, 3]) and t = s (BYTES [3])."""
    value = helper.make_tensor_value_info
    model = _model(
        [value("x", TensorProto.DOUBLE, [2, 3]), value("s", TensorProto.STRING, [3])],
        [value("y", TensorProto.DOUBLE, [2, 3]), value("t", TensorProto.STRING, [3])],
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["s"], ["t"])],
    )
    _write(repo, "flat", model, 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("classification_repo")
    write_scores(repo)
    write_flat(repo)
    process = start_server(repo)
    yield process
    assert process.stop() == 0


EXPECTED_TOP3 = [
    ["0.700000:1:dog", "0.700000:3:bird", "0.200000:2"],
    ["9.000000:0:cat", "3.500000:2", "3.500000:4"],
]


def strings(array: np.ndarray) -> list[Any]:
    """tritonclient gives bytes for binary BYTES and str for JSON: compare as str."""
    as_str = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])
    return as_str(array).tolist()


def _inputs(client: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    """tritonclient inputs (``client`` is tritonclient.http or .grpc), binary over HTTP."""
    wires = {"float32": "FP32", "float64": "FP64", "object": "BYTES"}
    inputs = []
    for name, array in arrays.items():
        tensor = client.InferInput(name, list(array.shape), wires[array.dtype.name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def http_infer(server: ServerProcess, model: str, outputs: list[Any], **arrays: Any) -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    return client.infer(model, _inputs(httpclient, arrays), outputs=outputs)


def grpc_infer(server: ServerProcess, model: str, outputs: list[Any], **arrays: Any) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    return client.infer(model, _inputs(grpcclient, arrays), outputs=outputs)


@pytest.mark.parametrize("binary", [False, True])
def test_http_answers_the_top_k_with_labels_per_sample(server: ServerProcess, binary: bool) -> None:
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary, class_count=3)]
    result = http_infer(server, "scores", outputs, x=SCORES)
    output = result.get_output("y")
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 3])
    assert ("binary_data_size" in output.get("parameters", {})) is binary
    assert strings(result.as_numpy("y")) == EXPECTED_TOP3


def test_grpc_answers_the_top_k_with_labels_per_sample(server: ServerProcess) -> None:
    outputs = [grpcclient.InferRequestedOutput("y", class_count=3)]
    result = grpc_infer(server, "scores", outputs, x=SCORES)
    output = result.get_output("y")
    assert (output.datatype, list(output.shape)) == ("BYTES", [2, 3])
    assert strings(result.as_numpy("y")) == EXPECTED_TOP3


def test_k_past_the_class_count_gives_every_class(server: ServerProcess) -> None:
    outputs = [grpcclient.InferRequestedOutput("y", class_count=100)]
    top = strings(grpc_infer(server, "scores", outputs, x=SCORES[:1]).as_numpy("y"))
    assert top == [["0.700000:1:dog", "0.700000:3:bird", "0.200000:2", "0.100000:0:cat",
                    "0.050000:4"]]  # fmt: skip


def test_integer_outputs_and_plain_outputs_in_one_request(server: ServerProcess) -> None:
    outputs = [
        httpclient.InferRequestedOutput("n", class_count=2),
        httpclient.InferRequestedOutput("y", binary_data=False),
    ]
    result = http_infer(server, "scores", outputs, x=SCORES)
    assert strings(result.as_numpy("n")) == [["0:0", "0:1"], ["9:0", "3:2"]]
    np.testing.assert_array_equal(result.as_numpy("y"), SCORES)


def test_a_model_without_batching_ranks_its_whole_output(server: ServerProcess) -> None:
    x = np.array([[1.5, -2.0, 8.25], [0.0, 8.25, 3.0]])
    s = np.array([b"a", b"b", b"c"], dtype=object)
    for result in (
        http_infer(server, "flat", [httpclient.InferRequestedOutput("y", class_count=4)], x=x, s=s),
        grpc_infer(server, "flat", [grpcclient.InferRequestedOutput("y", class_count=4)], x=x, s=s),
    ):
        assert strings(result.as_numpy("y")) == ["8.250000:2", "8.250000:4", "3.000000:5",
                                                 "1.500000:0"]  # fmt: skip


def test_image_client_postprocess_reads_value_index_and_label(server: ServerProcess) -> None:
    """image_client.py splits each entry at ':' into value, index and label."""
    result = grpc_infer(server, "scores", [grpcclient.InferRequestedOutput("y", class_count=1)],
                        x=SCORES)  # fmt: skip
    rows = [
        ["".join(chr(b) for b in entry).split(":") for entry in r] for r in result.as_numpy("y")
    ]
    assert rows == [[["0.700000", "1", "dog"]], [["9.000000", "0", "cat"]]]


UNSUPPORTED = [
    ("scores", "h", "class result not available for output due to unsupported type 'FP16'"),
    ("flat", "t", "class result not available for output due to unsupported type 'BYTES'"),
]


def _arrays(model: str) -> dict[str, np.ndarray]:
    if model == "scores":
        return {"x": SCORES}
    return {"x": np.zeros((2, 3)), "s": np.array([b"a", b"b", b"c"], dtype=object)}


@pytest.mark.parametrize(("model", "output", "message"), UNSUPPORTED)
def test_types_triton_cannot_classify_are_refused_in_its_words(
    server: ServerProcess, model: str, output: str, message: str
) -> None:
    requested = [httpclient.InferRequestedOutput(output, class_count=2)]
    with pytest.raises(InferenceServerException) as http_error:
        http_infer(server, model, requested, **_arrays(model))
    assert http_error.value.status() == "400"
    assert message in http_error.value.message()
    assert f"output '{output}'" in http_error.value.message()
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc_infer(server, model, [grpcclient.InferRequestedOutput(output, class_count=2)],
                   **_arrays(model))  # fmt: skip
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in grpc_error.value.message()


@pytest.mark.parametrize("k", [0, -1, "3"])
def test_a_bad_class_count_is_a_400_naming_the_output(server: ServerProcess, k: object) -> None:
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [0.0] * 5}],
        "outputs": [{"name": "y", "parameters": {"classification": k}}],
    }
    response = httpx.post(f"http://{server.http_url}/v2/models/scores/infer", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith("invalid value for 'classification' parameter")
    assert "output 'y'" in error


def test_a_negative_class_count_over_grpc_is_invalid_argument(server: ServerProcess) -> None:
    requested = [grpcclient.InferRequestedOutput("y", class_count=-5)]
    with pytest.raises(InferenceServerException) as caught:
        grpc_infer(server, "scores", requested, x=SCORES)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message().startswith(
        "invalid value for 'classification' parameter, expected >= 0: output 'y'"
    )


def test_class_count_zero_is_not_sent_and_gives_the_plain_output(server: ServerProcess) -> None:
    result = grpc_infer(server, "scores", [grpcclient.InferRequestedOutput("y", class_count=0)],
                        x=SCORES)  # fmt: skip
    assert result.get_output("y").datatype == "FP32"
    np.testing.assert_array_equal(result.as_numpy("y"), SCORES)


def test_the_server_lists_the_extension(server: ServerProcess) -> None:
    http_meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    grpc_meta = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata()
    assert "classification" in http_meta["extensions"]
    assert "classification" in grpc_meta.extensions


def test_a_missing_label_file_fails_the_load_naming_file_and_field(tmp_path: Path) -> None:
    write_scores(tmp_path)
    write_scores(tmp_path, "unlabelled")
    (tmp_path / "unlabelled" / "labels.txt").unlink()
    server = start_server(tmp_path, wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        response = httpx.post(
            f"http://{server.http_url}/v2/models/unlabelled/infer",
            json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [0] * 5}]},
        )
        served = http_infer(server, "scores", [httpclient.InferRequestedOutput("y", class_count=1)],
                            x=SCORES)  # fmt: skip
    finally:
        assert server.stop() == 0
    problem = (
        "unlabelled/config.pbtxt: output 'y': label_filename 'labels.txt': "
        "does not exist or is not a file"
    )
    failures = [r for r in server.logs if r.get("message") == "model failed to load"]
    assert [(r["model"], r["reason"]) for r in failures] == [("unlabelled", problem)]
    assert response.status_code == 503
    assert problem in response.json()["error"]
    assert strings(served.as_numpy("y")) == [["0.700000:1:dog"], ["9.000000:0:cat"]]
