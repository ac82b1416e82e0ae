"""A compute-bound CNN for the benchmark: ResNet-18's layout at 3x224x224, random weights.

Exported with ``batchserve export bench.models:resnet18ish`` at the start of each run; random
weights cost the same to run as trained ones, and keep the repository free of a 45 MB file.
"""

from __future__ import annotations

import torch
from torch import nn

IMAGE_SIZE = 224
CLASSES = 1000
# (channels, stride) of each BasicBlock: two per stage, four stages, as in ResNet-18.
BLOCKS = ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (1x1 projection when shapes change)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.body(x) + self.shortcut(x))
        return out


class ResNet18ish(nn.Module):
    """Stem (7x7 conv, max pool), eight BasicBlocks, global average pool, linear classifier."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], 64
        for cout, stride in BLOCKS:
            blocks.append(BasicBlock(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.stem(image)))
        return out


def resnet18ish(seed: int = 0) -> ResNet18ish:
    """The exporter's factory: the same random weights on every run."""
    torch.manual_seed(seed)
    return ResNet18ish().eval()
