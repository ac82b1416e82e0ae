"""Compute-bound CNNs for the benchmark, with random weights: ResNet-18's layout at 3x224x224,
a VGG-like stack of 3x3 convolutions at 3x192x192, and MobileNet's depthwise-separable
layout at 3x224x224 (less compute a byte of input, and a different best way to run).

Exported with ``batchserve export bench.models:resnet18ish`` (or ``:vgg192ish``,
``:mobilenetish``) during a run;
random weights cost the same to run as trained ones, and keep the repository free of large
files.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

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


def seeded(model: type[M], seed: int) -> M:
    """``model`` with the random weights ``seed`` gives, ready to export."""
    torch.manual_seed(seed)
    return model().eval()


def resnet18ish(seed: int = 0) -> ResNet18ish:
    """The exporter's factory: the same random weights on every run."""
    return seeded(ResNet18ish, seed)


class FeaturesThenHead(nn.Module):
    """A stack of feature layers, then a classifier head."""

    features: nn.Module
    head: nn.Module

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(image))
        return out


VGG_IMAGE_SIZE = 192
# Output channels of each VGG stage: two 3x3 convolutions with ReLU, then a 2x2 max pool.
VGG_STAGES = (32, 64, 128, 256)
VGG_HIDDEN = 256


def vgg_stage(cin: int, cout: int) -> nn.Sequential:
    """Two 3x3 convolutions with ReLU, then a 2x2 max pool halving the image."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class VGG192ish(FeaturesThenHead):
    """VGG's pattern, narrower: four conv stages (192 -> 12 pixels square), global average
    pool, and a small two-layer classifier; no batch norm or residuals, so the convolutions
    are nearly all of its cost."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        stages, cin = [], 3
        for cout in VGG_STAGES:
            stages.append(vgg_stage(cin, cout))
            cin = cout
        self.features = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(cin, VGG_HIDDEN),
            nn.ReLU(inplace=True),
            nn.Linear(VGG_HIDDEN, classes),
        )


def vgg192ish(seed: int = 0) -> VGG192ish:
    """The exporter's factory: the same random weights on every run."""
    return seeded(VGG192ish, seed)


# (output channels, stride) of each depthwise-separable block, as in MobileNet v1.
MOBILE_BLOCKS = (
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    *((512, 1),) * 5, (1024, 2), (1024, 1),
)  # fmt: skip
MOBILE_STEM_WIDTH = 32


def depthwise_separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    """A 3x3 convolution per channel, then a 1x1 across channels, each with batch norm."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.ReLU6(inplace=True),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class MobileNetish(FeaturesThenHead):
    """MobileNet v1's layout: a strided 3x3 stem, thirteen depthwise-separable blocks, global
    average pool and one linear layer."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, MOBILE_STEM_WIDTH, 3, 2, 1, bias=False),
            nn.BatchNorm2d(MOBILE_STEM_WIDTH),
            nn.ReLU6(inplace=True),
        ]
        cin = MOBILE_STEM_WIDTH
        for cout, stride in MOBILE_BLOCKS:
            layers.append(depthwise_separable(cin, cout, stride))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = classifier(cin, classes)


def mobilenetish(seed: int = 0) -> MobileNetish:
    """The exporter's factory: the same random weights on every run."""
    return seeded(MobileNetish, seed)
