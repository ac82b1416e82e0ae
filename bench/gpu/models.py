"""The check's two networks as PyTorch modules, with seeded random weights.

``resnet50ish`` is ResNet-50's layout (bottleneck blocks 3-4-6-3, 3x224x224 in, 1000 out)
written out here, initialised as torchvision initialises it: no model hub, no pretrained
weights, and the same weights in every process that builds it with the same seed.
``digits_cnn`` is the zoo's network; its trained weights ship only as ONNX, so the check
builds it with seeded random weights too, which cost the same to run.

``half=True`` wraps either in ``HalfPrecision``: FP16 inside, FP32 at the edges, so that an
FP16 model takes the same requests as the FP32 one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from batchserve.zoo.digits_cnn import DigitsCNN
from torch import nn

from bench.gpu.records import DIGITS, RESNET
from bench.models import CLASSES, STEM_WIDTH, Residual, classifier, stem

# (width, blocks, stride) of each stage; a block's output is 4 x its width.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4


def bottleneck(cin: int, width: int, stride: int) -> Residual:
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand, each with batch norm."""
    cout = width * EXPANSION
    body = nn.Sequential(
        nn.Conv2d(cin, width, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, width, 3, stride, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
    )
    return Residual(body, cin, cout, stride)


class ResNet50ish(nn.Module):
    """Stem (7x7 conv, max pool), 16 bottleneck blocks, global average pool, linear."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = stem()
        blocks, cin = [], STEM_WIDTH
        for width, count, stride in STAGES:
            for number in range(count):
                blocks.append(bottleneck(cin, width, stride if number == 0 else 1))
                cin = width * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.head = classifier(cin, classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.stem(image)))
        return out


class HalfPrecision(nn.Module):
    """``inner`` in FP16 between an FP32 input and FP32 outputs."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner.half()

    def forward(self, image: torch.Tensor) -> Any:  # the exporter matches input names
        out = self.inner(image.half())
        if isinstance(out, tuple):
            return tuple(o.float() for o in out)
        return out.float()


def resnet50ish(seed: int = 0, half: bool = False) -> nn.Module:
    """The exporter's factory (``bench.gpu.models:resnet50ish``)."""
    torch.manual_seed(seed)
    model: nn.Module = ResNet50ish().eval()
    return HalfPrecision(model).eval() if half else model


def digits_cnn(seed: int = 0, half: bool = False) -> nn.Module:
    """The zoo's DigitsCNN with seeded random weights (``bench.gpu.models:digits_cnn``)."""
    torch.manual_seed(seed)
    model: nn.Module = DigitsCNN().eval()
    return HalfPrecision(model).eval() if half else model


FACTORIES = {DIGITS: digits_cnn, RESNET: resnet50ish}


@torch.no_grad()
def reference(model: str, batch: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    """The FP32 eager module's outputs for ``batch`` on the CPU, in output order."""
    out = FACTORIES[model]()(torch.from_numpy(batch))
    outputs = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in outputs]
