"""The example models committed in model_repo/ are valid, accurate, and batch-safe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.models.repository import ModelRepository

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


def _session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(MODEL_REPO / name / "1" / "model.onnx"))


def _reported(name: str) -> dict[str, float]:
    return dict(json.loads((MODEL_REPO / name / "training.json").read_text()))


def test_the_shipped_repository_is_valid() -> None:
    resolved, problems = ModelRepository(MODEL_REPO).scan()
    assert problems == []
    assert sorted(m.name for m in resolved) == [
        "char_lstm", "char_lstm_generate", "char_lstm_step", "digits_cnn", "digits_cnn_uint8",
        "repeat_int32", "simple_sequence", "square_int32",
    ]  # fmt: skip


def test_digits_cnn_reaches_its_reported_held_out_accuracy() -> None:
    pytest.importorskip("sklearn")
    from batchserve.zoo.digits_cnn import load_digits_split

    split = load_digits_split()
    logits, probabilities = _session("digits_cnn").run(None, {"image": split.test_x})
    accuracy = float((logits.argmax(axis=1) == split.test_y).mean())
    assert accuracy >= 0.95
    assert accuracy == pytest.approx(_reported("digits_cnn")["held_out_accuracy"], abs=0.005)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_digits_cnn_uint8_is_digits_cnn_taking_greyscale_bytes() -> None:
    pytest.importorskip("sklearn")
    from batchserve.zoo.digits_cnn import as_bytes, load_digits_split

    split = load_digits_split()
    raw = as_bytes(split.test_x)
    logits, probabilities = _session("digits_cnn_uint8").run(None, {"image": raw})
    as_floats = (raw.transpose(0, 3, 1, 2) * np.float32(16 / 255)).astype(np.float32)
    twin_logits, twin_probabilities = _session("digits_cnn").run(None, {"image": as_floats})
    np.testing.assert_allclose(logits, twin_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(probabilities, twin_probabilities, rtol=1e-4, atol=1e-6)
    accuracy = float((logits.argmax(axis=1) == split.test_y).mean())
    assert accuracy == pytest.approx(_reported("digits_cnn_uint8")["held_out_accuracy"], abs=1e-9)
    assert accuracy >= 0.95


def test_char_lstm_reaches_its_reported_next_character_accuracy() -> None:
    from batchserve.zoo.char_lstm import load_corpus

    held_out = load_corpus().held_out
    seq = 96
    starts = np.arange(0, len(held_out) - seq - 1, seq)[:200]
    tokens = np.stack([held_out[s : s + seq] for s in starts])
    targets = np.array([held_out[s + seq] for s in starts])
    lengths = np.full((len(starts), 1), seq, dtype=np.int64)
    (logits,) = _session("char_lstm").run(None, {"tokens": tokens, "lengths": lengths})
    accuracy = float((logits.argmax(axis=1) == targets).mean())
    # 200 last-position predictions: a looser bound than the full held-out figure.
    assert accuracy >= _reported("char_lstm")["held_out_next_char_accuracy"] - 0.1


def test_char_lstm_rows_of_different_lengths_batch_like_one_by_one() -> None:
    session = _session("char_lstm")
    rng = np.random.default_rng(0)
    lengths = [3, 17, 1, 40]
    padded = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    alone = []
    for row, length in enumerate(lengths):
        ids = rng.integers(3, 98, size=length)
        padded[row, :length] = ids
        (out,) = session.run(None, {"tokens": ids[None, :], "lengths": np.array([[length]])})
        alone.append(out[0])
    (batched,) = session.run(None, {"tokens": padded, "lengths": np.array(lengths)[:, None]})
    np.testing.assert_allclose(batched, np.stack(alone), rtol=1e-4, atol=1e-5)


def test_simple_sequence_is_what_the_zoo_writes(tmp_path: Path) -> None:
    """The shipped copy of Triton's example sequence model is the zoo's, byte for byte."""
    from batchserve.zoo.sequence_models import write_simple_sequence

    written = write_simple_sequence(tmp_path)
    shipped = MODEL_REPO / "simple_sequence"
    for part in ("config.pbtxt", "1/model.onnx"):
        assert (written / part).read_bytes() == (shipped / part).read_bytes(), part


def test_char_lstm_generate_is_what_the_zoo_writes(tmp_path: Path) -> None:
    """Its vocabulary is char_lstm's own decoding of every token id."""
    from batchserve.zoo.char_lstm import VOCAB_SIZE, decode_id, write_generate

    written = write_generate(tmp_path)
    shipped = MODEL_REPO / "char_lstm_generate"
    for part in ("config.pbtxt", "vocabulary.json", "1/.gitkeep"):
        assert (written / part).read_bytes() == (shipped / part).read_bytes(), part
    symbols = json.loads((shipped / "vocabulary.json").read_text())
    assert symbols == [decode_id(token) for token in range(VOCAB_SIZE)]


def test_each_named_config_is_what_the_zoo_writes_from_config_pbtxt(tmp_path: Path) -> None:
    """configs/<name>.pbtxt (``--model-config-name``) never drifts from config.pbtxt."""
    from batchserve.zoo.variants import VARIANTS, write_variants

    for model in VARIANTS:
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.pbtxt").write_bytes(
            (MODEL_REPO / model / "config.pbtxt").read_bytes()
        )
        written = {path.name: path.read_bytes() for path in write_variants(tmp_path / model)}
        shipped = {p.name: p.read_bytes() for p in (MODEL_REPO / model / "configs").iterdir()}
        assert written == shipped, model


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_repository_is_valid_under_each_config_name_the_overlays_set(name: str) -> None:
    resolved, problems = ModelRepository(MODEL_REPO, name).scan()
    assert problems == []
    chosen = {m.name: m.config_file for m in resolved}
    assert chosen["digits_cnn"] == f"digits_cnn/configs/{name}.pbtxt"
    assert chosen["char_lstm"] == "char_lstm/config.pbtxt"


def test_the_gpu_config_asks_for_what_the_onnx_runtime_plans() -> None:
    """configs/gpu.pbtxt's accelerator is one batchserve runs: TensorRT in FP16, then CUDA."""
    from batchserve.backends.onnx_options import (
        CPU_EP,
        CUDA_EP,
        TENSORRT_EP,
        choose_providers,
    )
    from batchserve.core.device import Device

    model = ModelRepository(MODEL_REPO, "gpu").resolve("digits_cnn")
    plan = choose_providers(
        [TENSORRT_EP, CUDA_EP, CPU_EP], model.config, Device("gpu", 0),
        model_file=model.versions[0].model_file,
    )  # fmt: skip
    assert [name for name, _ in plan.providers] == [TENSORRT_EP, CUDA_EP, CPU_EP]
    assert plan.providers[0][1]["trt_fp16_enable"] == "True"
    assert plan.warnings == ()
