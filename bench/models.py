"""A compute-bound CNN for the benchmark: ResNet-18's layout at 3x224x224, random weights.

Exported with ``batchserve export bench.models:resnet18ish`` at the start of each run; random
weights cost the same to run as trained ones, and keep the repository free of a 45 MB file.
"""

from __future__ import annotations

import torch
from torch import nn

IMAGE_SIZE = 224
CLASSES = 1000
STEM_WIDTH = 64
# (channels, stride) of each basic block: two per stage, four stages, as in ResNet-18.
BLOCKS = ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1))


def stem() -> nn.Sequential:
    """ResNet's stem: 7x7 convolution with stride 2, batch norm, ReLU, 3x3 max pool."""
    return nn.Sequential(
        nn.Conv2d(3, STEM_WIDTH, 7, 2, 3, bias=False),
        nn.BatchNorm2d(STEM_WIDTH),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    )


def classifier(cin: int, classes: int) -> nn.Sequential:
    """Global average pool, then one linear layer."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class Residual(nn.Module):
    """``relu(body(x) + shortcut(x))``: the shortcut is a 1x1 projection where shapes change."""

    def __init__(self, body: nn.Module, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = body
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.body(x) + self.shortcut(x))
        return out


def basic_block(cin: int, cout: int, stride: int) -> Residual:
    """Two 3x3 convolutions with batch norm, around a shortcut."""
    body = nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
        nn.BatchNorm2d(cout),
    )
    return Residual(body, cin, cout, stride)


class ResNet18ish(nn.Module):
    """Stem (7x7 conv, max pool), eight basic blocks, global average pool, linear classifier."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = stem()
        blocks, cin = [], STEM_WIDTH
        for cout, stride in BLOCKS:
            blocks.append(basic_block(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = classifier(cin, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.stem(image)))
        return out


def resnet18ish(seed: int = 0) -> ResNet18ish:
    """The exporter's factory: the same random weights on every run."""
    torch.manual_seed(seed)
    return ResNet18ish().eval()
