"""Keras 3 files (torch backend) through `batchserve export`: signature, numbers, failures."""

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.export.keras_model import import_keras
from batchserve.models.model_config import load_pbtxt
from batchserve.proto.model_config_pb2 import DataType

keras = import_keras()
# Keras' torch backend saves variables through numpy's pre-2.0 __array__ protocol (Keras' own
# warning, not ours); everything else still fails the test.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


def two_input_model() -> Any:
    """FP32 features and INT64 tokens of free length in; a dict of two outputs out."""
    keras.utils.set_random_seed(0)
    features = keras.Input((6,), name="features")
    tokens = keras.Input((None,), dtype="int64", name="tokens")
    embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(tokens))
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([features, embedded])
    )
    score = keras.layers.Dense(1)(hidden)
    probabilities = keras.layers.Dense(3, activation="softmax")(hidden)
    return keras.Model(
        {"features": features, "tokens": tokens}, {"score": score, "probs": probabilities}
    )


def sequential_model() -> Any:
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(2)]
    )


def save(model: Any, path: Path) -> Path:
    model.save(path)
    return path


def test_keras_file_exports_with_its_own_signature_and_matches_keras(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    model = two_input_model()
    path = save(model, tmp_path / "ranker.keras")

    result = export_cli(str(path), "--name", "ranker", "--axis-sizes", "tokens_dim1=1,5")

    assert result.code == 0, result.err
    assert "ONNX Runtime vs Keras, 6 cases" in result.out
    assert "batch=8 tokens_dim1=5: probs max abs" in result.out
    assert "note: exporter warning" not in result.out  # Keras' tracing notes are expected
    config = load_pbtxt(repo / "ranker" / "config.pbtxt")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("features", DataType.TYPE_FP32, [6]),
        ("tokens", DataType.TYPE_INT64, [-1]),
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("probs", [3]), ("score", [1])]
    rng = np.random.default_rng(5)
    features = rng.standard_normal((4, 6)).astype(np.float32)
    tokens = rng.integers(0, 20, size=(4, 11)).astype(np.int64)
    session = ort.InferenceSession(
        str(repo / "ranker" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    probs, score = session.run(["probs", "score"], {"features": features, "tokens": tokens})
    expected = model.predict({"features": features, "tokens": tokens}, verbose=0)
    np.testing.assert_allclose(probs, expected["probs"], rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(score, expected["score"], rtol=1e-3, atol=1e-5)


def test_input_specs_override_the_keras_names_by_position(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    path = save(sequential_model(), tmp_path / "mlp.keras")

    result = export_cli(
        str(path), "--name", "mlp", "--input", "x:FP32:batch,4:-1..1", "--output", "y"
    )

    assert result.code == 0, result.err
    config = load_pbtxt(repo / "mlp" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [4])]
    assert [t.name for t in config.output] == ["y"]


def test_a_spec_count_that_does_not_fit_the_keras_inputs_is_refused(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    path = save(two_input_model(), tmp_path / "ranker.keras")

    result = export_cli(str(path), "--name", "m", "--input", "x:FP32:batch,6")

    assert result.code == 2
    assert "1 input(s) declared (x) but KerasModel.forward(features, tokens) takes 2" in result.err
    assert not repo.exists()


def not_a_zip(tmp_path: Path) -> Path:
    path = tmp_path / "text.keras"
    path.write_text("not a model")
    return path


def zip_without_config(tmp_path: Path) -> Path:
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights.bin", b"\0")
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing.keras", "missing.keras: no such file"),
        (not_a_zip, "text.keras is not a Keras 3 model file (model.save writes a zip archive)"),
        (zip_without_config, "other.keras is not a Keras 3 model file (no config.json in it)"),
    ],
)
def test_what_is_not_a_keras_3_file_is_refused(
    export_cli: Callable[..., Any],
    repo: Path,
    tmp_path: Path,
    make: Callable[[Path], Path],
    message: str,
) -> None:
    result = export_cli(str(make(tmp_path)), "--name", "m")

    assert result.code == 2
    assert result.err.startswith("batchserve export: error: MODEL ")
    assert message in result.err
    assert not repo.exists()


def test_another_keras_backend_is_refused(
    export_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save(sequential_model(), tmp_path / "mlp.keras")
    monkeypatch.setenv("KERAS_BACKEND", "jax")

    result = export_cli(str(path), "--name", "m")

    assert result.code == 2
    assert "KERAS_BACKEND is 'jax': Keras models are exported with the torch backend" in result.err


def test_factory_options_are_refused_for_a_keras_file(
    export_cli: Callable[..., Any], tmp_path: Path
) -> None:
    path = save(sequential_model(), tmp_path / "mlp.keras")

    result = export_cli(str(path), "--name", "m", "--state-dict", str(tmp_path / "w.pt"))

    assert result.code == 2
    assert "--state-dict is for a PyTorch factory; " in result.err
    assert "is a Keras model file, which holds its own weights" in result.err


@keras.saving.register_keras_serializable(package="batchserve_tests")
class Doubler(keras.Model):
    """A subclassed model: Keras records no input signature for it."""

    def call(self, x: Any) -> Any:
        return x * 2


def test_a_model_without_declared_inputs_needs_input_specs(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    model = Doubler()
    model(np.zeros((1, 3), np.float32))
    path = save(model, tmp_path / "doubler.keras")

    refused = export_cli(str(path), "--name", "m")
    assert refused.code == 2
    assert "declares no inputs (a subclassed model does not): give each with --input" in (
        refused.err
    )

    result = export_cli(str(path), "--name", "m", "--input", "x:FP32:batch,3")
    assert result.code == 0, result.err
    assert "ONNX Runtime vs Keras, 3 cases" in result.out
    assert [t.name for t in load_pbtxt(repo / "m" / "config.pbtxt").input] == ["x"]


def test_pt2_is_refused_for_a_keras_file_before_loading_it(
    export_cli: Callable[..., Any], tmp_path: Path
) -> None:
    result = export_cli(str(tmp_path / "absent.keras"), "--name", "m", "--format", "pt2")

    assert result.code == 2
    assert "--format pt2 cannot take a Keras model" in result.err
