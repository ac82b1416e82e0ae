"""The digits classifier as a Keras 3 user has it: a ``model.keras`` file to export.

A small CNN built and trained with Keras (torch backend) on the same split of scikit-learn's
8x8 digits as ``digits_cnn``, laid out channels last as Keras lays out images ([N, 8, 8, 1],
raw pixel values 0..16, scaled inside the model). Fifteen epochs take a few seconds on two
CPU cores and reach about 98 % held-out accuracy, seeded so every run trains the same model.
It is not part of ``make models``: it shows the way in from Keras, ``python -m
batchserve.zoo.digits_keras digits.keras`` then ``batchserve export digits.keras --name ...``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.export.keras_model import import_keras
from batchserve.zoo.digits_cnn import NUM_CLASSES, PIXEL_MAX, DigitsSplit, load_digits_split

EPOCHS = 15
BATCH_SIZE = 64
LEARNING_RATE = 3e-3
WIDTH = 16
SEED = 0


def build(seed: int = SEED) -> Any:
    """conv-relu, max-pool, conv-relu, flatten, dense: outputs ``logits`` and ``probabilities``."""
    keras = import_keras()
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    image = keras.Input((8, 8, 1), name="image")
    x = layers.Rescaling(1 / PIXEL_MAX)(image)
    x = layers.Conv2D(WIDTH, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(2 * WIDTH, 3, padding="same", activation="relu")(x)
    logits = layers.Dense(NUM_CLASSES, name="logits")(layers.Flatten()(x))
    probabilities = layers.Softmax(name="probabilities")(logits)
    return keras.Model(image, [logits, probabilities], name="digits_keras")


def channels_last(images: np.ndarray) -> np.ndarray:
    """``digits_cnn``'s [N, 1, 8, 8] images as the [N, 8, 8, 1] this model takes."""
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))


def train(split: DigitsSplit, epochs: int = EPOCHS, seed: int = SEED) -> tuple[Any, float]:
    """Train with Adam on the logits; return the model and its held-out accuracy."""
    keras = import_keras()
    model = build(seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=[loss, None])
    model.fit(
        channels_last(split.train_x),
        split.train_y,
        epochs=epochs,
        batch_size=BATCH_SIZE,
        shuffle=True,
        verbose=0,
    )
    return model, accuracy(model, split.test_x, split.test_y)


def accuracy(model: Any, images: np.ndarray, labels: np.ndarray) -> float:
    """Held-out accuracy of the model on ``digits_cnn``-layout images."""
    logits, _ = model.predict(channels_last(images), verbose=0)
    return float((np.asarray(logits).argmax(axis=1) == labels).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batchserve.zoo.digits_keras", description=__doc__
    )
    parser.add_argument("path", type=Path, help="where to save the model (must end in .keras)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    started = time.monotonic()
    model, held_out = train(load_digits_split(), args.epochs)
    model.save(args.path)
    took = time.monotonic() - started
    print(f"saved {args.path}: held-out accuracy {held_out:.3f}, trained in {took:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
