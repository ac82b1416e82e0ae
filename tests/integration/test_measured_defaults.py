"""A config that leaves instances and threads to the server (char_lstm ships one) is served
with what the load measured: the statistics show the choice and every figure over both
protocols, tritonclient's config shows it written in, and a config that chose is left alone."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from batchserve_client import Client

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

LSTM, DIGITS = "char_lstm", "digits_cnn"


@pytest.fixture(scope="module")
def two_cores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The two shipped models, the server told it has two cores (as CI's machine has)."""
    repo = tmp_path_factory.mktemp("measured")
    for name in (LSTM, DIGITS):
        shutil.copytree(MODEL_REPO / name, repo / name)
    server = start_server(repo, ["--cpus", "2"])
    yield server
    assert server.stop() == 0


def _measured(server: ServerProcess, scheme: str, model: str) -> dict[str, Any]:
    url = server.http_url if scheme == "http" else server.grpc_url
    with Client(f"{scheme}://{url}", timeout=30) as client:
        (stats,) = client.model_statistics(model)
    batchserve: dict[str, Any] = stats["batchserve"]
    return batchserve


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_the_choice_and_its_figures_are_in_the_statistics(
    two_cores: ServerProcess, scheme: str
) -> None:
    found = _measured(two_cores, scheme, LSTM)["measured_defaults"]
    settings = [(m["instances"], m["threads"]) for m in found["measured"]]
    assert settings == [(1, 0), (2, 1)], "the default, then one single-thread instance per core"
    assert all(m["samples_per_second"] > 0 and not m["error"] for m in found["measured"])
    chosen = (found["chosen"]["instances"], found["chosen"]["threads"])
    assert chosen in settings
    assert found["reason"]
    assert 0 < found["seconds"] < 10, "measuring is bounded to a few seconds"
    assert "measured_defaults" not in _measured(two_cores, scheme, DIGITS), "digits_cnn chose"


def test_the_served_config_holds_the_choice(two_cores: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(two_cores.http_url)
    chosen = _measured(two_cores, "http", LSTM)["measured_defaults"]["chosen"]
    config = client.get_model_config(LSTM)
    assert [g["count"] for g in config["instance_group"]] == [chosen["instances"]]
    threads = config.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value")
    assert threads == (str(chosen["threads"]) if chosen["threads"] else None)
    logged = [
        r
        for r in two_cores.logs
        if r.get("message") == "instances and threads chosen by measurement"
    ]
    assert [r["model"] for r in logged] == [LSTM]


def test_the_measured_instances_answer_as_the_model_does(two_cores: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(two_cores.http_url)
    tokens = np.array([[5, 6, 7, 8]], dtype=np.int64)
    lengths = np.array([[4]], dtype=np.int64)
    inputs = [httpclient.InferInput("tokens", [1, 4], "INT64"),
              httpclient.InferInput("lengths", [1, 1], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(lengths)
    answers = [client.infer(LSTM, inputs).as_numpy("next_char_logits") for _ in range(4)]
    session = ort.InferenceSession(str(MODEL_REPO / LSTM / "1" / "model.onnx"))
    (expected,) = session.run(None, {"tokens": tokens, "lengths": lengths})
    for answer in answers:
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
