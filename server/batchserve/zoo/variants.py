"""Named configurations of the example models (``<model>/configs/<name>.pbtxt``), which a
server started with ``--model-config-name <name>`` reads instead of config.pbtxt.

Each is the model's config.pbtxt with its instances (and, on a GPU, its accelerator)
changed, written from it by ``make models`` so that the two never drift apart: one
repository then serves the CPU and the GPU Kustomize overlays (``deploy/k8s/overlays``).
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from batchserve.models.model_config import parse_pbtxt, to_pbtxt
from batchserve.models.model_directory import CONFIG_FOLDER

CPU = """
instance_group [{ kind: KIND_CPU count: 2 }]
"""
"""Two one-thread instances: a burst is split across them (``Batcher._spread``)."""

GPU = """
instance_group [{ kind: KIND_GPU count: 2 }]
optimization { execution_accelerators { gpu_execution_accelerator [{
  name: "tensorrt"
  parameters { key: "precision_mode" value: "FP16" }
}] } }
"""
"""Two instances on each GPU (one copies while the other computes), through ONNX Runtime's
TensorRT provider in FP16, which the GPU image carries (CUDA alone, with a warning, where
the provider is missing)."""

VARIANTS: dict[str, dict[str, str]] = {"digits_cnn": {"cpu": CPU, "gpu": GPU}}
"""Per model, each named configuration's changes to config.pbtxt."""


HEADER = "# Written by `make models` from config.pbtxt (server/batchserve/zoo/variants.py).\n"


def variant_text(config_text: str, changes: str) -> str:
    """config.pbtxt's text with ``changes`` in place of the fields they set."""
    config = parse_pbtxt(config_text)
    config.ClearField("instance_group")
    text_format.Merge(changes, config)
    return HEADER + to_pbtxt(config)


def write_variants(model_dir: Path) -> list[Path]:
    """Write the model's named configurations from its config.pbtxt; none for other models."""
    written = []
    base = (model_dir / "config.pbtxt").read_text("utf-8")
    for name, changes in VARIANTS.get(model_dir.name, {}).items():
        path = model_dir / CONFIG_FOLDER / f"{name}.pbtxt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(variant_text(base, changes), "utf-8")
        written.append(path)
    return written
