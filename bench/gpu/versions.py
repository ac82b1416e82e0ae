"""The head of GPU_RESULTS.md: machine, GPU, driver, CUDA, every runtime's version, date."""

from __future__ import annotations

import sys
from importlib import metadata

from bench import machine
from bench.gpu.nvml import GpuInfo

SERVING = ("numpy", "onnx", "protobuf", "grpcio", "fastapi", "uvicorn", "uvloop")
RUNTIMES = ("onnxruntime", "onnxruntime-gpu", "tensorrt", "torch")
GPU_PREFIXES = ("tensorrt", "cuda-python", "cuda-bindings", "cupy", "nvidia-ml-py",
                "nvidia-cudnn", "nvidia-cuda-runtime")  # fmt: skip


def installed(prefixes: tuple[str, ...]) -> list[str]:
    """``name version`` of each installed distribution whose name starts with a prefix."""
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(prefixes):
            found[name] = f"{name} {dist.version}"
    return sorted(found.values())


def cuda_line() -> str:
    """CUDA and cuDNN as the runtimes were built for them (where they say): after discovery,
    which imports them."""
    parts = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.version.cuda is None:
        parts.append("torch is a CPU-only build")
    elif torch is not None:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        parts.append(f"torch built for CUDA {torch.version.cuda}, cuDNN {cudnn}")
    ort = sys.modules.get("onnxruntime")
    if ort is not None and hasattr(ort, "get_build_info"):
        parts.append(f"onnxruntime: {ort.get_build_info()}")
    return "CUDA builds: " + ("; ".join(parts) if parts else "no runtime imported")


def header(gpu: GpuInfo | None) -> list[str]:
    where = gpu.line() if gpu else "no GPU"
    lines = machine.describe(where, SERVING)
    runtimes = machine.versions(RUNTIMES) + installed(GPU_PREFIXES)
    lines.insert(3, "Runtimes and GPU packages: " + ", ".join(dict.fromkeys(runtimes)))
    return [line for line in lines if not line.startswith("perf_analyzer:")]
