"""A device a model instance runs on, named the way settings and errors name it."""

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
