"""Tiny real ``torch.export`` programs for tests, saved with ``torch.export.save``, and the
archive surgery that turns one into an attack on ``torch.export.load``."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

BATCH_MAX = 64
ROW = 8


class Mlp(nn.Module):
    """x[batch, 8] -> {"y": relu(x @ W + b), "hidden": x @ W + b}, plus a buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(ROW, 4)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.linear(x)
        return {"y": torch.relu(hidden) * self.scale, "hidden": hidden}


class TwoInputs(nn.Module):
    """ids[batch, 3] INT64 and x[batch, 8] FP32 -> a tuple of two tensors (ordinal names)."""

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ids * 3 + 7, x.sum(dim=1, keepdim=True)


class Wide(nn.Module):
    """x[batch, 8] -> {"y": 2 * x.sum(1) * WIDE_COPIES}, through a 256 KiB intermediate a row:
    activations that grow with the batch, as a large image's do."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        wide = x.repeat(1, WIDE_COPIES) * 2
        return {"y": wide.sum(dim=1, keepdim=True)}


WIDE_COPIES = 2**13


class Huge(nn.Module):
    """x[batch, 8] -> a 4 PiB intermediate per row: no machine can allocate it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.new_zeros((x.shape[0], 2**50))
        return wide[:, :1] + x[:, :1]


class SlowOnGpu(nn.Module):
    """x[batch, 8] -> {"y": x}, after a chain of 4096 x 4096 products of an identity matrix:
    some 80 ms of work on a GPU whatever the batch (values stay exact)."""

    def __init__(self, products: int = 40) -> None:
        super().__init__()
        self.products = products
        self.register_buffer("eye", torch.eye(4096))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        m = self.eye
        for _ in range(self.products):
            m = m @ self.eye
        return {"y": x * m[0, 0]}


def save_program(
    path: Path,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    *,
    batch_max: int = BATCH_MAX,
) -> Path:
    """Export with a dynamic batch axis (1..batch_max) on every input and save."""
    batch = torch.export.Dim("batch", min=1, max=batch_max)
    shapes = tuple({0: batch} for _ in example)
    program = torch.export.export(module.eval(), example, dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def mlp_program(path: Path) -> Path:
    return save_program(path, Mlp(), (torch.randn(3, ROW),))


class Marker:
    """A pickle that, once loaded, creates ``path``: the proof that something unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (os.mkdir, (str(self.path),))


def rewrite(
    source: Path, target: Path, edit: Callable[[str, bytes], bytes | None], extra: dict[str, bytes]
) -> Path:
    """Copy an archive entry by entry through ``edit`` (None keeps the entry), adding ``extra``
    (names relative to the archive's root folder)."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as copy:
        root = archive.namelist()[0].split("/", 1)[0]
        for info in archive.infolist():
            relative = info.filename.split("/", 1)[1]
            data = archive.read(info)
            copy.writestr(info.filename, edit(relative, data) or data)
        for relative, data in extra.items():
            copy.writestr(f"{root}/{relative}", data)
    return target


def edit_json(relative: str, change: Callable[[dict[str, Any]], None]) -> Callable[..., Any]:
    """An ``edit`` for ``rewrite`` changing one JSON entry in place."""

    def edit(name: str, data: bytes) -> bytes | None:
        if name != relative:
            return None
        document = json.loads(data)
        change(document)
        return json.dumps(document).encode()

    return edit


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(Marker(marker))


def torch_save_bytes(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()
