"""`make models`: train the example models here and export them through `batchserve export`.

Going through the same command users run keeps the example repository honest: the
ONNX files and configs in model_repo/ are exactly what the exporter produces.
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
from batchserve.zoo import MAX_QUEUE_DELAY_US, ONE_THREAD, ONE_THREAD_MODELS, char_lstm, digits_cnn

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
}  # fmt: skip


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


TRAINERS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, float]]]] = {
    "digits_cnn": _train_digits,
    "char_lstm": _train_char_lstm,
}


def build_one(name: str, repository: Path, work_dir: Path) -> dict[str, float]:
    """Train one model, export it into the repository, and record its metrics beside it."""
    started = time.monotonic()
    model, metrics = TRAINERS[name]()
    weights = work_dir / f"{name}.pt"
    torch.save(model.state_dict(), weights)
    args = [
        "export", *EXPORT_ARGS[name],
        "--name", name,
        "--state-dict", str(weights),
        "--model-repository", str(repository),
        "--max-batch-size", str(MAX_BATCH_SIZE),
        "--dynamic-batching",
        "--max-queue-delay-us", str(MAX_QUEUE_DELAY_US),
    ]  # fmt: skip
    if batchserve_main(args) != 0:
        raise SystemExit(f"exporting {name} failed")
    if name in ONE_THREAD_MODELS:
        config = repository / name / "config.pbtxt"
        config.write_text(config.read_text() + ONE_THREAD)
    metrics["training_seconds"] = round(time.monotonic() - started, 1)
    (repository / name / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m batchserve.zoo", description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repo"))
    parser.add_argument("--models", default=",".join(TRAINERS), help="comma-separated names")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            metrics = build_one(name, args.model_repository, Path(tmp))
            print(f"{name}: {json.dumps(metrics)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
