"""Devices a model instance can run on, and what the machine really has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["cpu", "gpu"]


@dataclass(frozen=True, slots=True)
class Device:
    """A CPU, or one GPU by its CUDA index."""

    kind: DeviceKind
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


CPU = Device("cpu")


def gpu_count() -> int:
    """Number of NVIDIA GPUs NVML can see; 0 where there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a base dependency
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
