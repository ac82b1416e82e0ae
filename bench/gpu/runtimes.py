"""The runtimes the check exercises, and how each one's model is exported and named.

FP16 means, per runtime, what a user of it would do: TensorRT builds an FP16 engine from the
FP32 model (``--tensorrt --fp16``); ONNX Runtime and PyTorch get the module cast to half
precision behind FP32 inputs and outputs (``bench.gpu.models.HalfPrecision``), so every
precision is served and measured over the same wire types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PRECISIONS = ("fp32", "fp16")


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime: its export flags, model file and where it runs.

    Args:
        key: short name used in tables and on the command line.
        label: what the report calls it.
        device: "gpu", or "cpu" for the dry run's runtimes.
        filename: the model file the export writes.
        suffix: what the export appends to the model's name (TensorRT: ``_trt``).
        flags: ``batchserve export`` flags that select this runtime.
    """

    key: str
    label: str
    device: Literal["cpu", "gpu"]
    filename: str
    suffix: str = ""
    flags: tuple[str, ...] = ()

    @property
    def builds_fp16(self) -> bool:
        """True when the runtime makes FP16 from the FP32 model itself (TensorRT)."""
        return "--tensorrt" in self.flags

    def export_flags(self, precision: str) -> list[str]:
        if precision == "fp16" and self.builds_fp16:
            return [*self.flags, "--fp16"]
        return list(self.flags)

    def half_module(self, precision: str) -> bool:
        """Whether the exported module is the half-precision wrapper."""
        return precision == "fp16" and not self.builds_fp16

    def served_name(self, model: str) -> str:
        return f"{model}{self.suffix}"


ORT_CUDA = RuntimeSpec("ort-cuda", "ONNX Runtime, CUDA EP", "gpu", "model.onnx")
TENSORRT = RuntimeSpec("tensorrt", "TensorRT engine", "gpu", "model.plan", "_trt", ("--tensorrt",))
PT2_CUDA = RuntimeSpec(
    "pt2", "PyTorch pt2 program, CUDA", "gpu", "model.pt2", "", ("--format", "pt2")
)
ORT_CPU = RuntimeSpec("ort-cpu", "ONNX Runtime, CPU EP", "cpu", "model.onnx")
PT2_CPU = RuntimeSpec(
    "pt2-cpu", "PyTorch pt2 program, CPU", "cpu", "model.pt2", "", ("--format", "pt2")
)

GPU_RUNTIMES = (ORT_CUDA, TENSORRT, PT2_CUDA)
CPU_RUNTIMES = (ORT_CPU, PT2_CPU)
BY_KEY = {spec.key: spec for spec in (*GPU_RUNTIMES, *CPU_RUNTIMES)}


def for_mode(cpu: bool) -> tuple[RuntimeSpec, ...]:
    return CPU_RUNTIMES if cpu else GPU_RUNTIMES
