"""Configs that leave instances and threads to the server are served with what the load
measured: a compute-heavy model is measured against one single-thread instance per core, a
light one (char_lstm ships without them) keeps the default after one round; the statistics
show the choice and every figure over both protocols, tritonclient's config shows it written
in, and a config that chose (digits_cnn sets its threads) is left alone."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from batchserve_client import Client
from onnx import TensorProto, helper, numpy_helper

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

pytestmark = pytest.mark.alone  # the load measures the machine: light or heavy, and how fast

LSTM, DIGITS, HEAVY = "char_lstm", "digits_cnn", "dense_stack"
WIDTH, LAYERS = 1024, 256
"""The heavy model: 256 dense 1024x1024 layers, 0.5 GFLOP a sample (2-3 ms on two cores)."""


def _write_heavy(repo: Path) -> None:
    """x FP32 [batch, WIDTH] -> y: LAYERS times relu(x W), one shared W (a 4 MiB file); its
    config sets no instance count and no threads."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    nodes, last = [], "x"
    for layer in range(LAYERS):
        nodes.append(helper.make_node("MatMul", [last, "w"], [f"m{layer}"]))
        nodes.append(helper.make_node("Relu", [f"m{layer}"], [f"r{layer}"]))
        last = f"r{layer}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(
        nodes, HEAVY,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / HEAVY / "1").mkdir(parents=True)
    onnx.save(model, str(repo / HEAVY / "1" / "model.onnx"))
    (repo / HEAVY / "config.pbtxt").write_text("max_batch_size: 16\ndynamic_batching {}\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The heavy model and two shipped ones."""
    root = tmp_path_factory.mktemp("measured")
    for name in (LSTM, DIGITS):
        shutil.copytree(MODEL_REPO / name, root / name)
    _write_heavy(root)
    return root


@pytest.fixture(scope="module")
def two_cores(repo: Path) -> Iterator[ServerProcess]:
    """The server on ``repo``, told it has two cores (as CI's machine has)."""
    server = start_server(repo, ["--cpus", "2"])
    yield server
    assert server.stop() == 0


def _batchserve(server: ServerProcess, scheme: str, model: str) -> dict[str, Any]:
    url = server.http_url if scheme == "http" else server.grpc_url
    with Client(f"{scheme}://{url}", timeout=30) as client:
        (stats,) = client.model_statistics(model)
    found: dict[str, Any] = stats["batchserve"]
    return found


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_the_choice_and_its_figures_are_in_the_statistics(
    two_cores: ServerProcess, scheme: str
) -> None:
    heavy = _batchserve(two_cores, scheme, HEAVY)["measured_defaults"]
    settings = [(m["instances"], m["threads"]) for m in heavy["measured"]]
    assert settings == [(1, 0), (2, 1)], "the default, then one single-thread instance per core"
    assert all(m["samples_per_second"] > 0 and not m["error"] for m in heavy["measured"])
    chosen = (heavy["chosen"]["instances"], heavy["chosen"]["threads"])
    assert chosen in settings
    assert "the default's throughput" in heavy["reason"]
    assert 0 < heavy["seconds"] < 10, "measuring is bounded to a few seconds"
    light = _batchserve(two_cores, scheme, LSTM)["measured_defaults"]
    assert [(m["instances"], m["threads"]) for m in light["measured"]] == [(1, 0)]
    assert (light["chosen"]["instances"], light["chosen"]["threads"]) == (1, 0)
    assert "request handling dominates" in light["reason"]
    assert "measured_defaults" not in _batchserve(two_cores, scheme, DIGITS), "it chose"


def test_the_served_config_holds_the_choice(two_cores: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(two_cores.http_url)
    chosen = _batchserve(two_cores, "http", HEAVY)["measured_defaults"]["chosen"]
    config = client.get_model_config(HEAVY)
    assert [g["count"] for g in config["instance_group"]] == [chosen["instances"]]
    threads = config.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value")
    assert threads == (str(chosen["threads"]) if chosen["threads"] else None)
    message = "instances and threads chosen by measurement"
    logged = sorted(str(r["model"]) for r in two_cores.logs if r.get("message") == message)
    assert logged == [LSTM, HEAVY]


def test_the_measured_instances_answer_as_the_model_does(
    two_cores: ServerProcess, repo: Path
) -> None:
    client = httpclient.InferenceServerClient(two_cores.http_url)
    x = np.random.default_rng(1).standard_normal((3, WIDTH)).astype(np.float32)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    session = ort.InferenceSession(str(repo / HEAVY / "1" / "model.onnx"))
    (expected,) = session.run(None, {"x": x})
    for _ in range(4):
        answer = client.infer(HEAVY, [tensor]).as_numpy("y")
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-4)
