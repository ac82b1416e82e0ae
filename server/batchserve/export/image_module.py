"""The nodes an exported graph starts with when its image input is sent as bytes.

``BytesImageModule`` puts the conversion an ``ImageInput`` describes in front of the module:
a cast to float first (TensorRT takes a UINT8 network input only straight into a cast), the
NHWC -> NCHW transpose, then one multiply-add per element for scale, mean and std. Traced
with the module, they become nodes of its graph, so on a GPU they run on the device with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchserve.export.image_input import ImageInput


class BytesImageModule(torch.nn.Module):
    """``module`` with its image input taken as bytes in the layout clients send.

    Args:
        module: the module, taking the image as float NCHW.
        inputs: forward's inputs in the order both modules take them.
        image: the conversion.
        rank: the image input's rank (the batch axis included).
    """

    def __init__(
        self, module: torch.nn.Module, inputs: Sequence[str], image: ImageInput, rank: int
    ) -> None:
        super().__init__()
        self.module = module
        self.position = list(inputs).index(image.input)
        self.permutation = image.permutation(rank)
        multiplier, offset = image.affine()  # a multiply by 1 or an add of 0 is left out
        self.multiplier = None if (multiplier == 1).all() else torch.from_numpy(multiplier)
        self.offset = None if (offset == 0).all() else torch.from_numpy(offset)

    def forward(self, *inputs: torch.Tensor) -> object:
        arguments = list(inputs)
        image = arguments[self.position].to(torch.float32)
        if self.permutation is not None:
            image = image.permute(self.permutation)
        if self.multiplier is not None:
            image = image * self.multiplier
        if self.offset is not None:
            image = image + self.offset
        arguments[self.position] = image
        return self.module(*arguments)
