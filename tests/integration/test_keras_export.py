"""A Keras user's way in: train the zoo's Keras digits CNN, save ``digits.keras``, export it
with `batchserve export digits.keras`, serve the repository, classify digits over HTTP.

Each step runs as a user runs it (its own process, this checkout's sources); over HTTP the
served model must score the held-out accuracy that Keras itself measured after training.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import REPO_ROOT, ServerProcess, start_server

pytestmark = pytest.mark.slow
MAX_BATCH_SIZE = 16


@dataclass(frozen=True)
class Served:
    server: ServerProcess
    keras_accuracy: float


def _run(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if find_spec("keras") is None:  # not imported here: it would pick its default backend
        pytest.skip("needs the export extra (keras)")
    root = tmp_path_factory.mktemp("keras")
    model_file = root / "digits.keras"
    trained = _run("batchserve.zoo.digits_keras", str(model_file))
    found = re.search(r"held-out accuracy (\d\.\d+)", trained)
    assert found, trained
    repo = root / "repo"
    exported = _run(
        "batchserve.cli", "export", str(model_file), "--name", "digits_keras",
        "--model-repository", str(repo), "--max-batch-size", str(MAX_BATCH_SIZE),
        "--dynamic-batching",
    )  # fmt: skip
    assert "ONNX Runtime vs Keras, 3 cases" in exported
    server = start_server(repo)
    yield Served(server, float(found.group(1)))
    assert server.stop() == 0


def _held_out() -> tuple[np.ndarray, np.ndarray]:
    """The held-out digits the Keras model was scored on, channels last as it takes them."""
    from batchserve.zoo.digits_cnn import load_digits_split

    split = load_digits_split()
    return np.ascontiguousarray(split.test_x.transpose(0, 2, 3, 1)), split.test_y


def _classify(client: httpclient.InferenceServerClient, images: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    result = client.infer("digits_keras", [tensor])
    probabilities = result.as_numpy("probabilities")
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    return np.asarray(result.as_numpy("logits")).argmax(axis=1)


def test_the_served_keras_model_classifies_digits(served: Served) -> None:
    images, labels = _held_out()
    client = httpclient.InferenceServerClient(served.server.http_url)

    first = _classify(client, images[:8])
    predicted = np.concatenate(
        [
            _classify(client, images[i : i + MAX_BATCH_SIZE])
            for i in range(0, len(images), MAX_BATCH_SIZE)
        ]
    )

    np.testing.assert_array_equal(first, labels[:8])
    accuracy = float((predicted == labels).mean())
    assert accuracy >= 0.95
    assert f"{accuracy:.3f}" == f"{served.keras_accuracy:.3f}"  # as Keras scored it


def test_the_config_declares_the_keras_signature(served: Served) -> None:
    config = httpclient.InferenceServerClient(served.server.http_url).get_model_config(
        "digits_keras"
    )

    assert config["max_batch_size"] == MAX_BATCH_SIZE
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("image", "TYPE_FP32", [8, 8, 1])
    ]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [
        ("logits", [10]),
        ("probabilities", [10]),
    ]
