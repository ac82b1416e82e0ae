"""Triton's load parameters through the real Triton clients: a ``config`` override, and
``file:`` parameters that make up a new model; malformed ones refused, naming them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}
ONNX = (MODEL_REPO / "digits_cnn/1/model.onnx").read_bytes()
Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's TMPDIR: where a load's own files are written, and removed from."""
    return tmp_path_factory.mktemp("server_tmp")


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory, temp_dir: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("override_repo")
    shutil.copytree(MODEL_REPO / "digits_cnn", repo / "digits_cnn")
    args = ["--model-control-mode", "explicit", "--load-model", "digits_cnn"]
    env = {"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN, "TMPDIR": str(temp_dir)}
    server = start_server(repo, args, extra_env=env)
    yield server
    assert server.stop() == 0


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, control: ServerProcess) -> Client:
    if request.param == "http":
        return httpclient.InferenceServerClient(control.http_url)
    return grpcclient.InferenceServerClient(control.grpc_url)


def _config(client: Client, name: str) -> dict[str, object]:
    config = client.get_model_config(name, headers=HEADERS, **_as_json(client))
    return dict(config.get("config", config))


def _loads_on_disk(temp_dir: Path) -> bool:
    return any(temp_dir.glob("batchserve-load-*"))


def _as_json(client: Client) -> dict[str, bool]:
    return {"as_json": True} if isinstance(client, grpcclient.InferenceServerClient) else {}


def _infer(client: Client, name: str, batch: int) -> np.ndarray:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    image = module.InferInput("image", [batch, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.ones((batch, 1, 8, 8), dtype=np.float32))
    result = client.infer(name, [image])
    probabilities: np.ndarray = result.as_numpy("probabilities")
    return probabilities


def test_a_config_override_is_served_and_a_plain_load_restores_the_repository(
    client: Client,
) -> None:
    """NVIDIA's model-control example: max_batch_size 64 in the repository, 16 sent."""
    client.load_model("digits_cnn", headers=HEADERS, config='{"max_batch_size":"16"}')
    config = _config(client, "digits_cnn")
    assert int(str(config["max_batch_size"])) == 16
    assert "dynamic_batching" not in config  # the override replaces the whole config
    assert _infer(client, "digits_cnn", 16).shape == (16, 10)
    with pytest.raises(InferenceServerException, match="batch"):
        _infer(client, "digits_cnn", 17)
    client.load_model("digits_cnn", headers=HEADERS)
    assert int(str(_config(client, "digits_cnn")["max_batch_size"])) == 64


def test_files_make_a_new_model_whose_files_go_when_it_is_unloaded(
    client: Client, temp_dir: Path
) -> None:
    config = json.dumps({"max_batch_size": 4, "platform": "onnxruntime_onnx"})
    files = {"file:1/model.onnx": ONNX}
    client.load_model("digits_copy", headers=HEADERS, config=config, files=files)
    assert client.is_model_ready("digits_copy")
    assert np.allclose(_infer(client, "digits_copy", 2), _infer(client, "digits_cnn", 2))
    index = client.get_model_repository_index(headers=HEADERS, **_as_json(client))
    rows = index if isinstance(index, list) else index["models"]
    assert {r["name"]: r.get("state") for r in rows}["digits_copy"] == "READY"
    assert _loads_on_disk(temp_dir)
    client.unload_model("digits_copy", headers=HEADERS, unload_dependents=True)
    assert not client.is_model_ready("digits_copy")
    assert not _loads_on_disk(temp_dir)


def test_a_failed_override_keeps_serving_the_loaded_model(client: Client, temp_dir: Path) -> None:
    files = {"file:1/model.onnx": b"not an onnx model"}
    with pytest.raises(InferenceServerException, match="load failed for model 'digits_cnn'"):
        client.load_model("digits_cnn", headers=HEADERS, config="{}", files=files)
    assert _infer(client, "digits_cnn", 1).shape == (1, 10)
    assert not _loads_on_disk(temp_dir)


@pytest.mark.parametrize(
    ("config", "files", "words"),
    [
        ('"parameters": {"config": {{"max_batch_size": "16"}}}', None, "Invalid config override"),
        ('{"max_batch_size": "lots"}', None, "parameter 'config'"),
        (None, {"file:1/model.onnx": ONNX}, "'config' must be specified for model file override"),
        ("{}", {"file:../escape/1/model.onnx": ONNX}, "'file:../escape/1/model.onnx'"),
        ("{}", {"file:/tmp/1/model.onnx": ONNX}, "the path is absolute"),
        ("{}", {"file:config.pbtxt": b"name: 'x'"}, "comes from parameter 'config'"),
    ],
    ids=[
        "not json",
        "wrong field type",
        "files without config",
        "traversal",
        "absolute",
        "config as a file",
    ],
)
def test_malformed_parameters_are_invalid_and_named(
    client: Client, config: str | None, files: dict[str, bytes] | None, words: str
) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.load_model("digits_cnn", headers=HEADERS, config=config, files=files)
    assert error.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    message = error.value.message()
    assert message.startswith("failed to load 'digits_cnn', failed to poll from model repository")
    assert words in message
    assert client.is_model_ready("digits_cnn")


def test_a_name_over_name_max_answers_triton_s_status(client: Client) -> None:
    """NVIDIA's gRPC model-control example expects INTERNAL and these words here."""
    with pytest.raises(InferenceServerException) as error:
        client.load_model(
            "digits_cnn", headers=HEADERS, config="{}", files={"file:" + "A" * 256: b"a"}
        )
    assert error.value.status() in ("500", "StatusCode.INTERNAL")
    assert "failed to poll from model repository" in error.value.message()
    assert client.is_server_live()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"parameters": {"file:1/model.onnx": "%%%", "config": "{}"}}, "is not valid base64"),
        ({"parameters": {"config": {"max_batch_size": 4}}}, "must have string type"),
        ({"parameters": {"priority": 1}}, "Unrecognized load parameter 'priority'"),
        ({"parameters": []}, "'parameters' must be a JSON object"),
    ],
)
def test_malformed_http_bodies_are_400(
    control: ServerProcess, body: dict[str, object], words: str
) -> None:
    url = f"http://{control.http_url}/v2/repository/models/digits_cnn/load"
    response = httpx.post(url, json=body, headers=HEADERS)
    assert response.status_code == 400
    assert words in response.json()["error"]


def test_the_body_is_bounded(control: ServerProcess) -> None:
    """A load body over the binary body limit is refused before it is all read."""
    url = f"http://{control.http_url}/v2/repository/models/digits_cnn/load"
    oversize = b'{"parameters": {"config": "' + b" " * (64 * 1024 * 1024) + b'"}}'
    response = httpx.post(url, content=oversize, headers=HEADERS)
    assert response.status_code == 413


def test_unload_parameters_are_checked(control: ServerProcess) -> None:
    url = f"http://{control.http_url}/v2/repository/models/absent/unload"
    body = {"parameters": {"unload_dependents": "yes"}}
    response = httpx.post(url, json=body, headers=HEADERS)
    assert response.status_code == 400
    assert "Unable to parse 'unload_dependents'" in response.json()["error"]
