"""``batchserve.Server`` in a Python process answers as a real server does over HTTP: the
same metadata and configuration, the same outputs, and the same errors in the same words."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.in_process_mistakes import MISTAKES
from tests.integration.server import REPO_ROOT, ServerProcess

DIGITS = "digits_cnn"
HTTP_TYPES = {"float32": "FP32", "float64": "FP64", "int32": "INT32"}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(4, 1, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def in_process(images: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("in_process") / "images.npy"
    np.save(path, images)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.in_process_answers", str(path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers: dict[str, Any] = json.loads(done.stdout)
    return answers


def _http(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=f"http://{server.http_url}", timeout=30)


def _http_infer(
    client: httpx.Client,
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    **parameters: object,
) -> httpx.Response:
    body: dict[str, Any] = {
        "inputs": [
            {"name": name, "datatype": HTTP_TYPES[str(array.dtype)],
             "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in inputs.items()
        ],
    }  # fmt: skip
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    if parameters:
        body["parameters"] = parameters
    return client.post(f"/v2/models/{model}/infer", json=body)


def test_metadata_and_config_equal_the_http_endpoints(
    server: ServerProcess, in_process: dict[str, Any]
) -> None:
    with _http(server) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert in_process["ready"] is True
        assert client.get(f"/v2/models/{DIGITS}").json() == in_process["metadata"]
        assert client.get(f"/v2/models/{DIGITS}/config").json() == in_process["config"]


def test_outputs_equal_the_http_answer(
    server: ServerProcess, in_process: dict[str, Any], images: np.ndarray
) -> None:
    with _http(server) as client:
        answer = _http_infer(client, DIGITS, {"image": images})
    assert answer.status_code == 200, answer.text
    over_http = {o["name"]: np.reshape(o["data"], o["shape"]) for o in answer.json()["outputs"]}
    assert sorted(over_http) == sorted(in_process["outputs"])
    for name, values in over_http.items():
        np.testing.assert_allclose(in_process["outputs"][name], values, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mistake", [name for name in MISTAKES if name != "decoupled model"])
def test_errors_carry_the_http_endpoints_words(
    server: ServerProcess, in_process: dict[str, Any], mistake: str
) -> None:
    model, inputs, options = MISTAKES[mistake]
    arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in inputs.items()}
    with _http(server) as client:
        answer = _http_infer(client, model, arrays, **options)
    kind, message = in_process["errors"][mistake]
    assert answer.status_code == {"InvalidArgument": 400, "NotFound": 404}[kind]
    assert answer.json() == {"error": message}


def test_a_decoupled_model_is_refused_with_tritons_words_and_the_way_to_stream(
    server: ServerProcess, in_process: dict[str, Any]
) -> None:
    with _http(server) as client:
        answer = _http_infer(client, "square_int32", {"IN": np.zeros(1, np.int32)})
    kind, message = in_process["errors"]["decoupled model"]
    assert (answer.status_code, kind) == (501, "Unsupported")
    triton = "doesn't support models with decoupled transaction policy"
    assert triton in answer.json()["error"]
    assert triton in message
    assert "Server.stream" in message
