"""The check's two networks as the exporter and the requests see them: no PyTorch needed.

``batchserve export`` arguments for each network (the runtime adds its own flags) and the
fixed batch the accuracy check feeds every runtime. The modules themselves are built by
``bench.gpu.models``, which imports torch: a machine without it still discovers, plans,
tests and reports, and says why nothing was exported.
"""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt
from batchserve.zoo import MAX_QUEUE_DELAY_US

from bench.gpu.records import DIGITS

PIXEL_MAX = 16
"""The digits' largest pixel value, as ``batchserve.zoo.digits_cnn.PIXEL_MAX`` (a module that
imports torch)."""

FP16_EXPORT_TOLERANCE = ("--atol", "0.05", "--rtol", "0.05")
"""The exporter compares the half-precision module on ONNX Runtime's CPU provider with the
same module in PyTorch; both round to FP16 at different points. The check's own accuracy
figures (against the FP32 eager module) are the ones reported."""


def export_args(model: str, half: bool, max_batch: int, image_size: int) -> list[str]:
    """``batchserve export`` arguments for one network (the runtime adds its own flags)."""
    if model == DIGITS:
        tensors = ["--input", f"image:FP32:batch,1,8,8:0..{PIXEL_MAX}",
                   "--output", "logits", "--output", "probabilities"]  # fmt: skip
    else:
        tensors = ["--input", f"image:FP32:batch,3,{image_size},{image_size}", "--output", "logits"]
    return [
        f"bench.gpu.models:{model}", "--factory-kwargs", json.dumps({"half": half}), *tensors,
        "--max-batch-size", str(max_batch), "--dynamic-batching",
        "--max-queue-delay-us", str(MAX_QUEUE_DELAY_US), "--batch-sizes", "1,2",
        *(FP16_EXPORT_TOLERANCE if half else ()),
    ]  # fmt: skip


def fixed_batch(model: str, batch: int, image_size: int) -> npt.NDArray[np.float32]:
    """The accuracy check's input: the same rows on every run (digits: pixel values 0..16)."""
    rng = np.random.default_rng(0)
    if model == DIGITS:
        return rng.integers(0, PIXEL_MAX + 1, (batch, 1, 8, 8)).astype(np.float32)
    return rng.standard_normal((batch, 3, image_size, image_size)).astype(np.float32)
