"""Where a model version's instances run: ``instance_group`` as Triton reads it, with the
server's choice (``KIND_AUTO``) left to the CPU where the version's runtime cannot use this
machine's GPUs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from batchserve.backends.selection import gpu_unusable
from batchserve.devices.placement import (
    Placement,
    gpu_count,
    group_signature,
    places_auto,
    resolve_placements,
)
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

_log = logging.getLogger(__name__)


def placements(
    config: ModelConfig, model_file: Path | None, *, warn: bool = True
) -> list[Placement]:
    """Each instance's device and group; ``model_file`` None (a version with no file of its
    own) places as the config says. ``warn``: say when the server's choice goes to the CPU
    on a GPU machine (off where the same version is placed again right after, so that one
    load says it once)."""
    gpus = gpu_count()
    unusable = gpu_unusable(config, model_file) if gpus and model_file is not None else ""
    if warn and unusable and places_auto(config):
        _log.warning(
            "model '%s': its instances are placed on the CPU although this machine has %d "
            "GPU(s): %s. Set instance_group { kind: KIND_CPU } to say so, or install the "
            "runtime's GPU build",
            config.name, gpus, unusable,
        )  # fmt: skip
    return resolve_placements(config, gpus, auto_gpu=not unusable)


def as_placed(config: ModelConfig, placed: Sequence[Placement]) -> ModelConfig:
    """``config`` as Triton serves it once placed on ``placed``'s devices (where the
    instances run: a GPU instance whose runtime fell back to the CPU is on the CPU): a
    ``KIND_AUTO`` group shows the kind its instances got, a GPU group without ``gpus`` the
    GPUs they are on, and a GPU group whose every instance fell back ``KIND_CPU``, so a client
    that reads the config learns where the model runs (Triton's NormalizeInstanceGroup never
    leaves ``KIND_AUTO``). ``config`` itself keeps what was written: reloads compare it."""
    shown = ModelConfig()
    shown.CopyFrom(config)
    for group in shown.instance_group:
        key = group_signature(group)
        devices = [placement.device for placement in placed if placement.group == key]
        if not devices:
            continue
        gpus = sorted({device.index for device in devices if device.kind == "gpu"})
        if group.kind == ModelInstanceGroup.KIND_AUTO or (
            group.kind == ModelInstanceGroup.KIND_GPU and not gpus  # every one fell back
        ):
            group.kind = ModelInstanceGroup.KIND_GPU if gpus else ModelInstanceGroup.KIND_CPU
            if not gpus:  # GPUs it listed that this machine lacks: a CPU group lists none
                group.ClearField("gpus")
        if group.kind == ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)
    return shown
