"""The suite's models compute what Triton's example models compute, and their configs say
what Triton's docs repository says: checked in-process, with onnxruntime and with Triton's
own model_config proto (as tritonclient ships it), before any server sees them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc.model_config_pb2 as mc
from google.protobuf import text_format

from tests.integration.triton.models import (
    ONNX_MODELS,
    SCALINGS,
    labels,
    preprocess,
    sample_image,
)


def _session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "1" / "model.onnx"))


def _config(repo: Path, name: str) -> mc.ModelConfig:
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), mc.ModelConfig())


def test_simple_adds_and_subtracts(triton_repo: Path) -> None:
    rng = np.random.default_rng(1)
    a, b = (rng.integers(-1000, 1000, (3, 16), dtype=np.int32) for _ in range(2))
    total, diff = _session(triton_repo, "simple").run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)


def test_simple_int8_adds_and_subtracts(triton_repo: Path) -> None:
    a = np.arange(-8, 8, dtype=np.int8)[np.newaxis]
    b = np.full((1, 16), 3, dtype=np.int8)
    total, diff = _session(triton_repo, "simple_int8").run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)


def test_simple_string_parses_and_prints_integers(triton_repo: Path) -> None:
    """Decimal text in, decimal text out, negatives included: Triton's simple_string."""
    a = np.arange(-8, 8, dtype=np.int32)[np.newaxis]
    b = np.full((1, 16), 7, dtype=np.int32)
    text = [np.array([[str(x) for x in row] for row in v], dtype=object) for v in (a, b)]
    total, diff = _session(triton_repo, "simple_string").run(
        None, {"INPUT0": text[0], "INPUT1": text[1]}
    )
    assert total.tolist() == [[str(x) for x in (a + b)[0]]]
    assert diff.tolist() == [[str(x) for x in (a - b)[0]]]


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("simple_identity", np.array([["he\x00llo", "", "x" * 40]], dtype=object)),
        ("custom_identity_int32", np.arange(-5, 5, dtype=np.int32).reshape(2, 5)),
    ],
)
def test_identities_return_their_input(triton_repo: Path, name: str, data: np.ndarray) -> None:
    (answer,) = _session(triton_repo, name).run(None, {"INPUT0": data})
    np.testing.assert_array_equal(answer, data)


def test_classifier_top_class_depends_on_the_scaling(triton_repo: Path) -> None:
    """Each image_client.py scaling mode gives its own top class, so a server that scaled
    differently, or read the image in another layout, is caught by the image tests."""
    session = _session(triton_repo, "densenet_onnx")
    tops = []
    for scaling in SCALINGS:
        (logits,) = session.run(None, {"data_0": preprocess(sample_image(), scaling)[np.newaxis]})
        assert logits.shape == (1, 1000, 1, 1)
        tops.append(int(logits.reshape(-1).argmax()))
    assert len(set(tops)) == len(tops), tops


def test_configs_are_triton_docs_configs(triton_repo: Path) -> None:
    """Names, types, dims, max_batch_size, reshape, format and labels as Triton's docs."""
    for name in ONNX_MODELS:
        config = _config(triton_repo, name)
        assert (config.name, config.platform) == (name, "onnxruntime_onnx")
        graph = onnx.load(triton_repo / name / "1" / "model.onnx").graph
        assert [t.name for t in config.input] == [t.name for t in graph.input]
        assert [t.name for t in config.output] == [t.name for t in graph.output]
    for name, data_type in (("simple", mc.TYPE_INT32), ("simple_string", mc.TYPE_STRING)):
        config = _config(triton_repo, name)
        assert config.max_batch_size == 8
        for tensor in [*config.input, *config.output]:
            assert (tensor.data_type, list(tensor.dims)) == (data_type, [16])
    densenet = _config(triton_repo, "densenet_onnx")
    assert densenet.max_batch_size == 0
    (data,), (fc,) = densenet.input, densenet.output
    assert (data.name, data.format, list(data.dims)) == (
        "data_0",
        mc.ModelInput.FORMAT_NCHW,
        [3, 224, 224],
    )
    assert list(data.reshape.shape) == [1, 3, 224, 224]
    assert (fc.name, list(fc.dims), list(fc.reshape.shape)) == ("fc6_1", [1000], [1, 1000, 1, 1])
    assert fc.label_filename == "densenet_labels.txt"
    lines = (triton_repo / "densenet_onnx" / fc.label_filename).read_text().splitlines()
    assert lines == labels()
    assert len(lines) == 1000
