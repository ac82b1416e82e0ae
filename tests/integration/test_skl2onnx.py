"""scikit-learn classifiers exported by skl2onnx, the files as that tool writes them, served
with no config.pbtxt and called with NVIDIA's clients; the answers are scikit-learn's own.

skl2onnx writes the batch axis as a dim with neither a size nor a name, the label as a
tensor of nothing but that axis (completed as Triton completes it: ``dims: [1]``, so clients
receive ``[N, 1]``), and by default the probabilities as a sequence of maps (ZipMap), which
no Triton backend serves: that file is refused saying which option gives a tensor instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

from tests.integration.server import ServerProcess, start_server

X, Y = load_digits(return_X_y=True)
X = X.astype(np.float32)
SAMPLES = X[:24]  # within the completed max_batch_size (32)


@pytest.fixture(scope="module")
def fitted() -> dict[str, LogisticRegression | RandomForestClassifier]:
    return {
        "logistic": LogisticRegression(max_iter=3000).fit(X, Y),
        "forest": RandomForestClassifier(n_estimators=8, max_depth=8, random_state=0).fit(X, Y),
    }


def _write(repo: Path, name: str, model: object, zipmap: bool) -> None:
    onx = to_onnx(model, X[:1], options={id(model): {"zipmap": zipmap}}, target_opset=17)
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.onnx").write_bytes(onx.SerializeToString())


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    fitted: dict[str, LogisticRegression | RandomForestClassifier],
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("skl2onnx")
    for name, model in fitted.items():
        _write(repo, name, model, zipmap=False)
    _write(repo, "logistic_zipmap", fitted["logistic"], zipmap=True)
    process = start_server(repo, wait_ready=False)  # the ZipMap file is meant to fail
    try:
        process.wait_for("server not ready: a model failed to load")
        yield process
    finally:
        assert process.stop() == 0


@pytest.mark.parametrize("name", ["logistic", "forest"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_classifier_answers_as_scikit_learn_does(
    server: ServerProcess,
    fitted: dict[str, LogisticRegression | RandomForestClassifier],
    name: str,
    protocol: str,
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(
        server.http_url if protocol == "http" else server.grpc_url
    )  # type: ignore[attr-defined]
    features = module.InferInput("X", list(SAMPLES.shape), "FP32")  # type: ignore[attr-defined]
    features.set_data_from_numpy(SAMPLES)
    result = client.infer(name, [features])
    model = fitted[name]
    labels = result.as_numpy("label")
    assert labels.shape == (len(SAMPLES), 1)
    np.testing.assert_array_equal(labels[:, 0], model.predict(SAMPLES))
    probabilities = result.as_numpy("probabilities")
    np.testing.assert_allclose(probabilities, model.predict_proba(SAMPLES), atol=1e-5)


def test_the_default_zipmap_export_is_refused_naming_the_option(server: ServerProcess) -> None:
    assert not httpclient.InferenceServerClient(server.http_url).is_model_ready("logistic_zipmap")
    (failure,) = [
        str(record["reason"])
        for record in server.logs
        if record.get("message") == "model failed to load"
    ]
    assert "'output_probability' is seq(map(int64,tensor(float))), not a tensor" in failure
    assert "{'zipmap': False}" in failure
