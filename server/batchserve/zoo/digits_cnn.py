"""A small CNN for scikit-learn's 8x8 handwritten digits.

The model takes raw pixel intensities (0..16, as the data set stores them) and scales
them itself, so clients send the data as it is. ``digits_cnn_uint8`` is the same model
exported to take 8-bit greyscale images (0..255, HWC) as bytes: ``from_onnx`` reads the
trained weights back out of the exported digits_cnn, and ``as_bytes`` turns the data set's
images into what its clients send.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

PIXEL_MAX = 16.0
NUM_CLASSES = 10
BYTE_SCALE = "16/255"  # digits_cnn_uint8's --normalize scale: byte 255 is pixel value 16


class DigitsCNN(nn.Module):
    """conv-bn-relu x2, max-pool, conv-relu, global average pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(64, NUM_CLASSES))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.classifier(self.features(image / PIXEL_MAX))
        return logits, torch.softmax(logits, dim=1)


def build() -> DigitsCNN:
    """Factory for `batchserve export batchserve.zoo.digits_cnn:build`."""
    return DigitsCNN()


def from_onnx(path: Path) -> DigitsCNN:
    """The DigitsCNN an exported digits_cnn ONNX file computes, in eval mode.

    The exporter folds each BatchNorm into the convolution before it, so the file holds the
    weights of the three convolutions and the linear layer; the BatchNorms become identities.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    nodes = [node for node in graph.node if node.op_type in ("Conv", "Gemm")]
    model = DigitsCNN()
    modules = dict(model.named_modules())
    layers = [name for name, m in modules.items() if isinstance(m, nn.Conv2d | nn.Linear)]
    if len(nodes) != len(layers):
        raise ValueError(f"{path}: {len(nodes)} Conv/Gemm nodes, DigitsCNN has {len(layers)}")
    state = model.state_dict()
    for node, name in zip(nodes, layers, strict=True):
        state[f"{name}.weight"] = torch.from_numpy(values[node.input[1]].copy())
        state[f"{name}.bias"] = torch.from_numpy(values[node.input[2]].copy())
    for name, norm in modules.items():
        if isinstance(norm, nn.BatchNorm2d):
            size = norm.num_features
            state[f"{name}.running_mean"] = torch.zeros(size)
            state[f"{name}.running_var"] = torch.ones(size)
            state[f"{name}.weight"] = torch.full((size,), float(np.sqrt(1.0 + norm.eps)))
            state[f"{name}.bias"] = torch.zeros(size)
    model.load_state_dict(state, strict=True)
    return model.eval()


def as_bytes(images: np.ndarray) -> np.ndarray:
    """[N, 1, 8, 8] pixel values 0..16 as [N, 8, 8, 1] 8-bit greyscale, as a camera gives."""
    scaled = np.rint(images * (255 / PIXEL_MAX)).clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(scaled.transpose(0, 2, 3, 1))


@dataclass(frozen=True)
class DigitsSplit:
    """Train/held-out split of the digits data, images shaped [N, 1, 8, 8] float32."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def load_digits_split(seed: int = 0, test_fraction: float = 0.2) -> DigitsSplit:
    """Stratified split of sklearn's digits (1,797 images) with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = data.images.astype(np.float32)[:, None, :, :]
    labels = data.target.astype(np.int64)
    tx, vx, ty, vy = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    return DigitsSplit(tx, ty, vx, vy)


def train(split: DigitsSplit, epochs: int = 40, seed: int = 0) -> tuple[DigitsCNN, float]:
    """Train with Adam and return the model with its held-out accuracy."""
    torch.manual_seed(seed)
    model = DigitsCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(split.train_x), torch.from_numpy(split.train_y)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=generator).split(64):
            optimiser.zero_grad()
            logits, _ = model(x[idx])
            nn.functional.cross_entropy(logits, y[idx]).backward()
            optimiser.step()
    return model.eval(), accuracy(model, split.test_x, split.test_y)


@torch.no_grad()
def accuracy(model: DigitsCNN, images: np.ndarray, labels: np.ndarray) -> float:
    logits, _ = model.eval()(torch.from_numpy(images))
    return float((logits.argmax(dim=1).numpy() == labels).mean())
