"""The repository extension: off by default, token-protected when on, load/unload live."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

TOKEN = CONTROL_TOKEN


def test_the_index_is_answered_when_the_mode_is_none(server: ServerProcess) -> None:
    """Triton answers the index in every control mode; only load and unload are refused."""
    rows = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert {row["name"]: row["state"] for row in rows} == {
        "digits_cnn": "READY",
        "digits_cnn_uint8": "READY",
        "char_lstm": "READY",
        "char_lstm_step": "READY",
        "simple_sequence": "READY",
        "char_lstm_generate": "READY",
        "repeat_int32": "READY",
        "square_int32": "READY",
    }
    index = grpcclient.InferenceServerClient(server.grpc_url).get_model_repository_index()
    assert {(m.name, m.version, m.state) for m in index.models} == {
        ("digits_cnn", "1", "READY"),
        ("digits_cnn_uint8", "1", "READY"),
        ("char_lstm", "1", "READY"),
        ("char_lstm_step", "1", "READY"),
        ("simple_sequence", "1", "READY"),
        ("char_lstm_generate", "1", "READY"),
        ("repeat_int32", "1", "READY"),
        ("square_int32", "1", "READY"),
    }


def test_load_and_unload_are_unavailable_when_the_mode_is_none(server: ServerProcess) -> None:
    """Triton's status (UNAVAILABLE, HTTP 503) and words, then how to turn control on."""
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    calls = [(c, "503") for c in (http.load_model, http.unload_model)]
    calls += [(c, "StatusCode.UNAVAILABLE") for c in (grpc.load_model, grpc.unload_model)]
    for call, status in calls:
        with pytest.raises(InferenceServerException) as error:
            call("digits_cnn")
        assert error.value.status() == status
        message = error.value.message()
        assert message.startswith(
            "explicit model load / unload is not allowed if polling is enabled"
        )
        assert "--model-control-mode explicit" in message
    response = httpx.post(f"http://{server.http_url}/v2/repository/models/digits_cnn/load")
    assert response.status_code == 503
    assert "retry-after" not in response.headers  # retrying cannot help
    assert http.is_model_ready("digits_cnn")


def test_control_needs_the_token(explicit_server: ServerProcess) -> None:
    url = f"http://{explicit_server.http_url}/v2/repository/index"
    assert httpx.post(url).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    rows = httpx.post(url, headers={"Authorization": f"Bearer {TOKEN}"}).json()
    # char_lstm, never loaded, by its name alone, as Triton's index lists it
    assert rows == [{"name": "char_lstm"}, {"name": "digits_cnn", "version": "1", "state": "READY"}]
    index = grpcclient.InferenceServerClient(explicit_server.grpc_url).get_model_repository_index(
        headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == [
        ("char_lstm", "", "", ""),
        ("digits_cnn", "1", "READY", ""),
    ]


def test_load_and_unload_over_grpc(explicit_server: ServerProcess) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    assert not client.is_model_ready("char_lstm")
    client.load_model("char_lstm", headers=headers)
    assert client.is_model_ready("char_lstm")
    client.unload_model("char_lstm", headers=headers)
    assert not client.is_model_ready("char_lstm")
    with pytest.raises(InferenceServerException, match=r"not ready|not loaded"):
        client.get_model_metadata("char_lstm")
    index = client.get_model_repository_index(headers=headers, as_json=True)
    assert {m["name"]: m["state"] for m in index["models"]}["char_lstm"] == "UNAVAILABLE"


def test_grpc_control_without_the_token_is_unauthenticated(
    explicit_server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    for headers in (None, {"authorization": "Bearer wrong"}):
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as error:
                call("char_lstm", headers=headers)
            assert error.value.status() == "StatusCode.UNAUTHENTICATED"
            assert error.value.message().startswith("model control and settings updates need")
    assert not client.is_model_ready("char_lstm")


def test_loading_an_unknown_model_is_404(explicit_server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"http://{explicit_server.http_url}/v2/repository/models/absent/load"
    response = httpx.post(url, headers=headers)
    assert response.status_code == 404
    said = response.json()["error"]
    assert said.startswith("failed to load 'absent', failed to poll from model repository (")
    assert said.count("failed to poll") == 1  # Triton's opening, once


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/char_lstm/load",
        "/v2/repository/models/char_lstm/unload",
        "/v2/logging",
        "/v2/trace/setting",
    ],
)
def test_a_body_is_never_read_before_the_token_is_checked(
    explicit_server: ServerProcess, path: str
) -> None:
    """Only the head is sent, announcing 10 MiB: the 401 must come before any body byte."""
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {10 << 20}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", explicit_server.http_port), timeout=5) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:100]


@pytest.mark.parametrize(
    "path",
    ["/v2/repository/models/digits_cnn/load", "/v2/repository/models/digits_cnn/unload"],
)
def test_a_body_is_never_read_when_model_control_is_off(server: ServerProcess, path: str) -> None:
    """Only the head is sent, announcing 10 MiB: with control off the 503 comes before any
    body byte, as the 401 does for a bad token."""
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {10 << 20}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
    assert b"explicit model load / unload is not allowed" in answer


def test_readiness_is_tritons_strict_readiness(explicit_server: ServerProcess) -> None:
    """Not ready while a model tried has failed its load; ready again once it loads; and an
    unload on request, even of a model loaded at start, keeps the server in service (it
    used to answer 503 until that model was loaded again: a readiness probe would have
    taken the pod out of service for an operator's unload)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    assert client.is_server_ready()
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("char_lstm", headers=headers, config='{"max_batch_size": -5}')
    failed_load = client.is_server_ready()
    client.load_model("char_lstm", headers=headers)
    loaded = client.is_server_ready()
    client.unload_model("char_lstm", headers=headers)
    client.unload_model("digits_cnn", headers=headers)
    unloaded = client.is_server_ready()
    client.load_model("digits_cnn", headers=headers)
    assert (failed_load, loaded, unloaded) == (False, True, True)
    assert client.is_server_ready()


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_a_version_a_reload_leaves_out_is_listed_unloaded_and_not_at_ready_state(
    tmp_path: Path, workers: str
) -> None:
    """Triton's explicit-mode reload test (L0_storage_S3: load, add version 3, load again,
    then the index as JSON), and L0_lifecycle's request for the version left behind."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    server = start_server(
        tmp_path, ["--model-control-mode", "explicit", "--workers", workers], wait_ready=False
    )
    base = f"http://{server.http_url}/v2/repository"
    try:
        assert httpx.post(f"{base}/models/digits_cnn/load", timeout=60).status_code == 200
        assert httpx.post(f"{base}/index").json() == [
            {"name": "digits_cnn", "version": "1", "state": "READY"}
        ]
        shutil.copytree(tmp_path / "digits_cnn" / "1", tmp_path / "digits_cnn" / "3")
        assert httpx.post(f"{base}/models/digits_cnn/load", timeout=60).status_code == 200
        assert httpx.post(f"{base}/index").json() == [
            {"name": "digits_cnn", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "digits_cnn", "version": "3", "state": "READY"},
        ]
        image = np.zeros((1, 1, 8, 8), np.float32)
        for module, url, status in (
            (httpclient, server.http_url, "503"),
            (grpcclient, server.grpc_url, "StatusCode.UNAVAILABLE"),
        ):
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(image)
            with pytest.raises(InferenceServerException) as refusal:
                client.infer("digits_cnn", [tensor], model_version="1")
            assert refusal.value.status() == status
            assert refusal.value.message().startswith(
                "Request for unknown model: 'digits_cnn' version 1 is not at ready state"
            )
        retired = httpx.get(f"http://{server.http_url}/v2/models/digits_cnn/versions/1")
        assert retired.status_code == 503
        assert "retry-after" not in retired.headers  # waiting does not bring it back
        for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
            client = module.InferenceServerClient(url)
            assert not client.is_model_ready("digits_cnn", "1")
            assert client.is_model_ready("digits_cnn", "3")
            tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(image)
            assert client.infer("digits_cnn", [tensor]).as_numpy("logits").shape == (1, 10)
            # L0_server_status's statistics of the version left behind, and of a model gone
            with pytest.raises(InferenceServerException) as refusal:
                client.get_inference_statistics("digits_cnn", "1")
            assert refusal.value.message().startswith(
                "requested model version is not available for model 'digits_cnn'"
            )
            with pytest.raises(InferenceServerException) as refusal:
                client.get_inference_statistics("no_such_model")
            assert refusal.value.message().startswith(
                "requested model 'no_such_model' is not available"
            )
        stats = httpx.get(f"http://{server.http_url}/v2/models/digits_cnn/versions/3/stats")
        assert [s["version"] for s in stats.json()["model_stats"]] == ["3"]
        stale = httpx.get(f"http://{server.http_url}/v2/models/digits_cnn/versions/1/stats")
        assert stale.status_code == 400  # Triton's INVALID_ARG
        assert httpx.post(f"{base}/models/digits_cnn/unload", timeout=60).status_code == 200
        assert httpx.post(f"{base}/index").json() == [
            {"name": "digits_cnn", "version": version, "state": "UNAVAILABLE", "reason": "unloaded"}
            for version in ("1", "3")
        ]
    finally:
        assert server.stop() == 0


def _write_model(root: Path, name: str, graph_op: str = "Identity", dims: str = "4") -> None:
    """An FP32 model of one op over [batch, 4], its config declaring ``dims``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node(graph_op, ["x"], ["y"])], name, [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True)
    onnx.save(model, root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
    )


def test_load_failures_open_as_triton_finds_them(tmp_path: Path) -> None:
    """Triton reads a model's config when it polls the repository, and its files when it
    loads the model: a refusal of the files (unreadable, not what the config says, or an op
    the runtime lacks) is "load failed for model", every time it is asked (L0_lifecycle's
    test_model_control_fail), and one of the config alone "failed to poll"."""
    _write_model(tmp_path, "unknown_op", graph_op="NoSuchOp")
    _write_model(tmp_path, "dims_contradicted", dims="5")
    _write_model(tmp_path, "unreadable")
    (tmp_path / "unreadable" / "1" / "model.onnx").write_bytes(b"not a protobuf at all")
    _write_model(tmp_path, "bad_config")
    config = tmp_path / "bad_config" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: -3"))
    server = start_server(tmp_path, ["--model-control-mode", "explicit"], wait_ready=False)
    try:
        clients = (
            httpclient.InferenceServerClient(server.http_url),
            grpcclient.InferenceServerClient(server.grpc_url),
        )
        for model in ("unknown_op", "dims_contradicted", "unreadable", "bad_config"):
            opening = (
                "failed to load 'bad_config', failed to poll from model repository: "
                if model == "bad_config"
                else f"load failed for model '{model}': "
            )
            if model == "unknown_op":  # refused by the runtime, per version as Triton says it
                opening += "version 1 is at UNAVAILABLE state: Invalid argument: "
            for client in (*clients, clients[0]):  # asked again, it fails again alike
                with pytest.raises(InferenceServerException) as refusal:
                    client.load_model(model)
                assert refusal.value.message().startswith(opening), refusal.value.message()
                assert not client.is_model_ready(model)
    finally:
        assert server.stop() == 0


def test_a_specific_version_without_its_directory_leaves_the_others_served(
    tmp_path: Path,
) -> None:
    """L0_lifecycle's file-override test: version_policy specific [1, 3] with 1 gone serves
    3, and says why 1 is not, as Triton does (it used to fail the whole model)."""
    shutil.copytree(MODEL_REPO / "digits_cnn" / "1", tmp_path / "digits_cnn" / "3")
    config = (MODEL_REPO / "digits_cnn" / "config.pbtxt").read_text()
    (tmp_path / "digits_cnn" / "config.pbtxt").write_text(
        config + "\nversion_policy { specific { versions: [1, 3] } }\n"
    )
    server = start_server(
        tmp_path, ["--model-control-mode", "explicit", "--load-model", "digits_cnn"]
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("digits_cnn", "3")
        assert not client.is_model_ready("digits_cnn", "1")
        server.drain_logs()
        assert any(
            r.get("message") == "version 1 is specified for model 'digits_cnn', but the version "
            "directory is not present"
            for r in server.logs
        )
    finally:
        assert server.stop() == 0
