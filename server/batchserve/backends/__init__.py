"""Pick the runtime for a model: from config.pbtxt's ``backend``/``platform``, else the file suffix.

Runtimes are imported only when chosen, so a CPU-only install never imports TensorRT or
torch, and a server without onnxruntime can still serve TensorRT plans and PyTorch programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchserve.backends.base import Backend
from batchserve.backends.reshape import with_reshape
from batchserve.core.errors import ModelConfigError
from batchserve.devices.placement import resolve_devices
from batchserve.proto.model_config_pb2 import ModelConfig

__all__ = ["Backend", "create_backend", "resolve_devices", "runtime_name"]


@dataclass(frozen=True, slots=True)
class _Runtime:
    backend: str  # Triton's `backend` name
    platform: str  # Triton's `platform` name
    suffix: str  # model file suffix in the repository


_RUNTIMES = (
    _Runtime("onnxruntime", "onnxruntime_onnx", ".onnx"),
    _Runtime("tensorrt", "tensorrt_plan", ".plan"),
    # Triton's PyTorch backend is "pytorch"; its platforms are TorchScript (pytorch_libtorch,
    # model.pt) and AOTInductor builds (torch_aoti), neither of which a torch.export program is.
    _Runtime("pytorch", "torch_export", ".pt2"),
)


def runtime_name(config: ModelConfig, model_file: Path) -> str:
    """The Triton backend name serving ``model_file``; ModelConfigError when none fits."""
    by_backend = _lookup("backend", config.backend, model_file)
    by_platform = _lookup("platform", config.platform, model_file)
    if by_backend and by_platform and by_backend != by_platform:
        raise ModelConfigError(
            f"{model_file}: backend '{config.backend}' and platform '{config.platform}' disagree"
        )
    by_suffix = next((r for r in _RUNTIMES if r.suffix == model_file.suffix), None)
    chosen = by_backend or by_platform or by_suffix
    if chosen is None:
        suffixes = ", ".join(r.suffix for r in _RUNTIMES)
        raise ModelConfigError(
            f"{model_file}: cannot tell which runtime serves this file; set backend or platform "
            f"in config.pbtxt, or use one of the suffixes {suffixes}"
        )
    if by_suffix is not None and by_suffix != chosen:
        raise ModelConfigError(
            f"{model_file}: config.pbtxt asks for {chosen.backend}, but the file is a "
            f"{by_suffix.suffix} model for {by_suffix.backend}"
        )
    return chosen.backend


def _lookup(field: str, value: str, model_file: Path) -> _Runtime | None:
    if not value:
        return None
    found = next((r for r in _RUNTIMES if getattr(r, field) == value), None)
    if found is None:
        known = ", ".join(getattr(r, field) for r in _RUNTIMES)
        raise ModelConfigError(
            f"{model_file}: field '{field}' is '{value}': batchserve does not support this "
            f"{field} (yet); supported: {known}"
        )
    return found


def create_backend(
    config: ModelConfig, model_file: Path, *, memory_limit_bytes: int | None = None
) -> Backend:
    """An unloaded backend for ``model_file``; ``memory_limit_bytes`` caps ONNX Runtime's arena.

    The config's ``reshape`` is applied here, around the runtime, so it holds for every one.
    """
    return with_reshape(_runtime_backend(config, model_file, memory_limit_bytes), config)


def _runtime_backend(
    config: ModelConfig, model_file: Path, memory_limit_bytes: int | None
) -> Backend:
    runtime = runtime_name(config, model_file)
    if runtime == "tensorrt":
        from batchserve.backends.tensorrt import TensorRTBackend

        return TensorRTBackend()
    if runtime == "pytorch":
        from batchserve.backends.torch_pt2 import TorchBackend

        return TorchBackend()
    from batchserve.backends.onnx import OnnxBackend

    return OnnxBackend(memory_limit_bytes=memory_limit_bytes)
