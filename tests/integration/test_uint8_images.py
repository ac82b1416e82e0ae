"""Images sent as bytes: a model exported with `batchserve export --normalize`, served, and
answered over HTTP and gRPC as its FP32 twin answers the equivalent float NCHW input.

The twin is the same module and weights exported for FP32 NCHW input; both are served by one
server. The shipped digits_cnn_uint8 is checked against digits_cnn the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import REPO_ROOT, ServerProcess, start_server

MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])
HEIGHT, WIDTH = 6, 7
CONV = {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}
# (protocol, HTTP binary tensors)
PROTOCOLS = [("http", True), ("http", False), ("grpc", True)]


def _export(repo: Path, weights: Path, *argv: str) -> None:
    """`batchserve export torch.nn:Conv2d` as a user runs it, with this checkout's sources."""
    command = [
        sys.executable, "-m", "batchserve.cli", "export", "torch.nn:Conv2d",
        "--factory-kwargs", json.dumps(CONV), "--state-dict", str(weights),
        "--model-repository", str(repo), "--max-batch-size", "8", "--batch-sizes", "1,3", *argv,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with ``bytes`` (UINT8 NHWC in) and ``floats`` (FP32 NCHW in), same weights."""
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("uint8")
    torch.manual_seed(0)
    weights = root / "conv.pt"
    torch.save(torch.nn.Conv2d(**CONV).state_dict(), weights)
    repo = root / "repo"
    _export(repo, weights, "--name", "floats", "--input", f"input:FP32:batch,3,{HEIGHT},{WIDTH}")
    _export(
        repo, weights, "--name", "bytes", "--input", f"input:UINT8:batch,{HEIGHT},{WIDTH},3",
        "--normalize", f"mean={','.join(map(str, MEAN))}", f"std={','.join(map(str, STD))}",
    )  # fmt: skip
    server = start_server(repo)
    yield server
    assert server.stop() == 0


def _infer(
    server: ServerProcess, protocol: str, binary: bool, model: str, inputs: tuple[str, np.ndarray]
) -> Any:
    """One request with one input, through tritonclient; the result (``as_numpy``)."""
    name, array = inputs
    datatype = "UINT8" if array.dtype == np.uint8 else "FP32"
    if protocol == "http":
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        return httpclient.InferenceServerClient(server.http_url).infer(model, [tensor])
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return grpcclient.InferenceServerClient(server.grpc_url).infer(model, [tensor])


def _as_floats(raw: np.ndarray) -> np.ndarray:
    """The float NCHW tensor the twin takes: what the bytes model does in its graph."""
    return ((raw / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2).astype(np.float32)


@pytest.mark.parametrize(("protocol", "binary"), PROTOCOLS, ids=["http", "http-json", "grpc"])
def test_a_uint8_export_answers_as_its_fp32_twin(
    twins: ServerProcess, protocol: str, binary: bool
) -> None:
    raw = np.random.default_rng(1).integers(0, 256, size=(3, HEIGHT, WIDTH, 3)).astype(np.uint8)

    got = _infer(twins, protocol, binary, "bytes", ("input", raw)).as_numpy("output0")
    twin = _infer(twins, protocol, binary, "floats", ("input", _as_floats(raw)))

    assert got.shape == (3, 4, HEIGHT, WIDTH)
    np.testing.assert_allclose(got, twin.as_numpy("output0"), rtol=1e-5, atol=1e-5)


def test_the_config_declares_uint8_in_the_layout_clients_send(twins: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(twins.http_url)
    inputs = http.get_model_config("bytes")["input"]
    assert [(t["name"], t["data_type"], t["dims"]) for t in inputs] == [
        ("input", "TYPE_UINT8", [HEIGHT, WIDTH, 3])
    ]
    metadata = grpcclient.InferenceServerClient(twins.grpc_url).get_model_metadata("bytes")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("input", "UINT8", [-1, HEIGHT, WIDTH, 3])
    ]
    assert http.get_model_config("floats")["input"][0]["data_type"] == "TYPE_FP32"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_shipped_digits_cnn_uint8_answers_as_digits_cnn(
    server: ServerProcess, protocol: str
) -> None:
    raw = np.random.default_rng(2).integers(0, 256, size=(5, 8, 8, 1)).astype(np.uint8)
    floats = (raw.transpose(0, 3, 1, 2) * np.float32(16 / 255)).astype(np.float32)

    got = _infer(server, protocol, True, "digits_cnn_uint8", ("image", raw))
    twin = _infer(server, protocol, True, "digits_cnn", ("image", floats))

    for name in ("logits", "probabilities"):
        np.testing.assert_allclose(got.as_numpy(name), twin.as_numpy(name), rtol=1e-4, atol=1e-5)
