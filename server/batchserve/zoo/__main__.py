"""`make models`: train the example models here and export them through `batchserve export`.

Going through the same command users run keeps the example repository honest: the
ONNX files and configs in model_repo/ are exactly what the exporter produces.
``digits_cnn_uint8`` is not trained: it is the repository's digits_cnn, read back from its
ONNX file and exported again to take images as bytes, so the two always share weights.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from batchserve.cli import main as batchserve_main
from batchserve.zoo import (
    MAX_QUEUE_DELAY_US,
    ONE_THREAD,
    ONE_THREAD_MODELS,
    char_lstm,
    digits_cnn,
    sequence_models,
    variants,
)

MAX_BATCH_SIZE = 64

EXPORT_ARGS = {
    "digits_cnn": [
        "batchserve.zoo.digits_cnn:build",
        "--input", "image:FP32:batch,1,8,8:0..16",
        "--output", "logits",
        "--output", "probabilities",
    ],
    "char_lstm": [
        "batchserve.zoo.char_lstm:build",
        "--input", f"tokens:INT64:batch,seq:0..{char_lstm.VOCAB_SIZE - 1}",
        "--input", "lengths:INT64:batch,1:1..seq",
        "--output", "next_char_logits",
        "--axis-sizes", "seq=1,7,33,100",
        "--sequence-length-input", "lengths",
    ],
    "digits_cnn_uint8": [
        "batchserve.zoo.digits_cnn:build",
        "--input", "image:UINT8:batch,8,8,1",
        "--normalize", "mean=0", "std=1", f"scale={digits_cnn.BYTE_SCALE}",
        "--output", "logits",
        "--output", "probabilities",
    ],
    "char_lstm_step": [
        "batchserve.zoo.char_lstm:build_step",
        "--input", f"token:INT64:batch,1:0..{char_lstm.VOCAB_SIZE - 1}",
        "--input", f"h_in:FP32:batch,{char_lstm.LAYERS},{char_lstm.HIDDEN}",
        "--input", f"c_in:FP32:batch,{char_lstm.LAYERS},{char_lstm.HIDDEN}",
        "--output", "next_char_logits",
        "--output", "h_out",
        "--output", "c_out",
    ],
}  # fmt: skip
SEQUENCE_MODELS = frozenset({"char_lstm_step"})
"""Exported without dynamic batching; their config is then written for the sequence batcher."""


def _train_digits() -> tuple[torch.nn.Module, dict[str, float]]:
    split = digits_cnn.load_digits_split()
    model, acc = digits_cnn.train(split)
    return model, {"held_out_accuracy": acc, "held_out_images": float(len(split.test_y))}


def _train_char_lstm() -> tuple[torch.nn.Module, dict[str, float]]:
    corpus = char_lstm.load_corpus()
    model, acc = char_lstm.train(corpus)
    return model, {
        "held_out_next_char_accuracy": acc,
        "train_characters": float(len(corpus.train)),
        "held_out_characters": float(len(corpus.held_out)),
    }


def _digits_as_bytes(repository: Path) -> tuple[torch.nn.Module, dict[str, float]]:
    shipped = repository / "digits_cnn" / "1" / "model.onnx"
    if not shipped.exists():
        raise SystemExit(f"digits_cnn_uint8 takes its weights from {shipped}: build digits_cnn")
    model = digits_cnn.from_onnx(shipped)
    split = digits_cnn.load_digits_split()
    images = digits_cnn.as_bytes(split.test_x)  # what a client sends, back as the model sees it
    seen = images.transpose(0, 3, 1, 2).astype("float32") * (digits_cnn.PIXEL_MAX / 255)
    accuracy = digits_cnn.accuracy(model, seen, split.test_y)
    return model, {"held_out_accuracy": accuracy, "held_out_images": float(len(split.test_y))}


TRAINERS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, float]]]] = {
    "digits_cnn": _train_digits,
    "char_lstm": _train_char_lstm,
}


def _char_lstm_step(repository: Path) -> tuple[torch.nn.Module, dict[str, float]]:
    shipped = repository / "char_lstm" / "1" / "model.onnx"
    if not shipped.exists():
        raise SystemExit(f"char_lstm_step takes its weights from {shipped}: build char_lstm")
    model = char_lstm.from_onnx(shipped)
    step = char_lstm.CharLSTMStep(model)
    return step, {"max_abs_logit_difference": char_lstm.step_difference(model, step)}


DERIVED: dict[str, Callable[[Path], tuple[torch.nn.Module, dict[str, float]]]] = {
    "digits_cnn_uint8": _digits_as_bytes,
    "char_lstm_step": _char_lstm_step,
}
"""Models built from others already in the repository (listed after them), not trained."""


WRITTEN: dict[str, Callable[[Path], Path]] = {
    "simple_sequence": sequence_models.write_simple_sequence,
    "char_lstm_generate": char_lstm.write_generate,
}
"""Models whose ONNX graph is written node by node (no weights to train): the contract of
Triton's example models, for NVIDIA's client examples."""


def build_one(name: str, repository: Path, work_dir: Path) -> dict[str, float]:
    """Train one model, export it into the repository, and record its metrics beside it."""
    if name in WRITTEN:
        WRITTEN[name](repository)
        return {}
    started = time.monotonic()
    if name in DERIVED:
        model, metrics = DERIVED[name](repository)
    else:
        model, metrics = TRAINERS[name]()
    weights = work_dir / f"{name}.pt"
    torch.save(model.state_dict(), weights)
    args = [
        "export", *EXPORT_ARGS[name],
        "--name", name,
        "--state-dict", str(weights),
        "--model-repository", str(repository),
        "--max-batch-size", str(MAX_BATCH_SIZE),
    ]  # fmt: skip
    if name not in SEQUENCE_MODELS:
        args += ["--dynamic-batching", "--max-queue-delay-us", str(MAX_QUEUE_DELAY_US)]
    if batchserve_main(args) != 0:
        raise SystemExit(f"exporting {name} failed")
    config = repository / name / "config.pbtxt"
    if name in SEQUENCE_MODELS:
        config.write_text(char_lstm.step_config(name, MAX_BATCH_SIZE, MAX_QUEUE_DELAY_US))
    # a re-export keeps the setting from the config it replaces: add it once
    if name in ONE_THREAD_MODELS and '"intra_op_thread_count"' not in config.read_text():
        config.write_text(config.read_text() + ONE_THREAD)
    variants.write_variants(repository / name)  # after config.pbtxt, which they are made from
    if name in TRAINERS:
        metrics["training_seconds"] = round(time.monotonic() - started, 1)
    (repository / name / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m batchserve.zoo", description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repo"))
    parser.add_argument(
        "--models", default=",".join([*TRAINERS, *DERIVED, *WRITTEN]), help="comma-separated names"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            metrics = build_one(name, args.model_repository, Path(tmp))
            print(f"{name}: {json.dumps(metrics)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
