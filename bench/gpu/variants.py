"""A served variant of an exported model: its config with batching and CUDA graphs set.

Each variant is a repository of its own holding the model's files (hard links where the
file system allows: the server refuses version directories that lead outside its
repository, so no symbolic links) under an edited ``config.pbtxt``: one instance on the
runtime's device, dynamic batching as exported or removed, and, for graphs, one CUDA graph
per power-of-two batch size up to the maximum.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt, to_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

from bench.gpu.records import Variant


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_batch``, which is always included."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch)


def configure(config: ModelConfig, variant: Variant, device: str) -> ModelConfig:
    """A copy of ``config`` set up for ``variant`` with one instance on ``device``."""
    edited = ModelConfig()
    edited.CopyFrom(config)
    if not variant.batching:
        edited.ClearField("dynamic_batching")
    edited.ClearField("instance_group")
    kind = ModelInstanceGroup.KIND_GPU if device == "gpu" else ModelInstanceGroup.KIND_CPU
    edited.instance_group.add(kind=kind, count=1)
    if edited.HasField("optimization"):
        edited.optimization.ClearField("cuda")
        if not edited.optimization.ListFields():
            edited.ClearField("optimization")
    if variant.graphs:
        cuda = edited.optimization.cuda
        cuda.graphs = True
        for size in batch_sizes(edited.max_batch_size):
            cuda.graph_spec.add(batch_size=size)
    return edited


def build(model_dir: Path, root: Path, variant: Variant, device: str) -> Path:
    """The repository serving ``model_dir`` as ``variant`` (made once, then reused)."""
    flags = f"b{int(variant.batching)}g{int(variant.graphs)}"
    repository = root / f"{model_dir.parent.name}-{flags}"
    target = repository / model_dir.name
    if target.exists():
        return repository
    shutil.copytree(
        model_dir,
        target,
        ignore=shutil.ignore_patterns(CONFIG_FILENAME),
        copy_function=_link_or_copy,
    )
    config = configure(load_pbtxt(model_dir / CONFIG_FILENAME), variant, device)
    (target / CONFIG_FILENAME).write_text(to_pbtxt(config))
    return repository


def _link_or_copy(source: str, destination: str) -> str:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
    return destination
