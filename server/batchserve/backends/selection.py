"""Which runtime serves a model: the one table of runtimes, and the choice from config.pbtxt's
``backend``/``platform`` or else the model file's suffix.

The model repository names a version's format with the same functions, so a config the
repository accepts is one ``create_backend`` serves. Runtimes are imported only when chosen,
so a CPU-only install never imports TensorRT or torch, and a server without onnxruntime can
still serve TensorRT plans and PyTorch programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from batchserve.backends.base import Backend
from batchserve.backends.reshape import with_reshape
from batchserve.core.errors import ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class ModelFormat:
    """A servable model file format and the names Triton configs give its runtime."""

    platform: str  # Triton's `platform` name
    backend: str  # Triton's `backend` name
    suffix: str  # model file suffix in the repository

    @property
    def default_filename(self) -> str:
        return f"model{self.suffix}"


ONNX: Final = ModelFormat("onnxruntime_onnx", "onnxruntime", ".onnx")
TENSORRT: Final = ModelFormat("tensorrt_plan", "tensorrt", ".plan")
# Triton's PyTorch backend is "pytorch"; its platforms are TorchScript (pytorch_libtorch,
# model.pt) and AOTInductor builds (torch_aoti), neither of which a torch.export program is.
PT2: Final = ModelFormat("torch_export", "pytorch", ".pt2")
FORMATS: Final = (ONNX, TENSORRT, PT2)
"""The formats a model file is found by: a repository's version directories are searched
for these files."""
IDENTITY: Final = ModelFormat("", "identity", ".identity")
"""Triton's identity backend (``backends/identity.py``): chosen by name, never by a file, for
it reads none (Triton names its file ``model.identity`` all the same)."""

SUPPORTED: Final = (
    "batchserve serves ONNX (.onnx), TensorRT (.plan) and torch.export (.pt2, platform "
    "torch_export) models, and Triton's identity backend (no file)"
)


def format_from_config(config: ModelConfig, *, source: str) -> ModelFormat | None:
    """The format named by ``platform``/``backend``; None when neither is set.

    ``source`` (the config file, or the model file) starts every error message.
    """
    by_backend = _named_format(source, "backend", config.backend)
    backend = config.backend or _filename_backend(config.default_model_filename)
    # Triton's ValidateModelConfig words, the backend filled from the file name as it fills it
    pair = f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {backend}"
    try:
        by_platform = _named_format(source, "platform", config.platform)
    except ModelConfigError as exc:
        if backend and config.platform != "ensemble":
            ours = exc.message.removeprefix(f"{source}: ")
            raise ModelConfigError(f"{source}: {pair} (batchserve: {ours})") from None
        raise
    if by_platform and by_backend and by_platform != by_backend:
        raise ModelConfigError(
            f"{source}: {pair} (batchserve: platform '{config.platform}' contradicts backend "
            f"'{config.backend}': the two disagree on the runtime; set one of them, or both to "
            "the same runtime)"
        )
    return by_platform or by_backend


def _filename_backend(filename: str) -> str:
    found = format_from_filename(filename) if filename else None
    return found.backend if found else ""


def _named_format(source: str, field: str, value: str) -> ModelFormat | None:
    if not value:
        return None
    for fmt in (*FORMATS, IDENTITY):
        if value == getattr(fmt, field):
            return fmt
    if value == "ensemble":
        raise ModelConfigError(
            f"{source}: field '{field}' is 'ensemble': an ensemble has no model file of its "
            "own to run; its config's ensemble_scheduling runs other models"
        )
    raise ModelConfigError(
        f"{source}: field '{field}' is '{value}': batchserve does not support the {field} "
        f"(yet); {SUPPORTED}"
    )


def format_from_filename(filename: str) -> ModelFormat | None:
    """The format a model file's suffix implies, or None for any other file."""
    return next((fmt for fmt in FORMATS if filename.endswith(fmt.suffix)), None)


def runtime_name(config: ModelConfig, model_file: Path) -> str:
    """The Triton backend name serving ``model_file``; ModelConfigError when none fits."""
    named = format_from_config(config, source=str(model_file))
    by_suffix = format_from_filename(model_file.name)
    chosen = named or by_suffix
    if chosen is None:
        suffixes = ", ".join(fmt.suffix for fmt in FORMATS)
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


def gpu_unusable(config: ModelConfig, model_file: Path) -> str:
    """Why the runtime serving ``model_file`` cannot run on a GPU in this process ("" when
    it can): ``KIND_AUTO`` then places the model on the CPU instead of failing its load, as
    Triton does for a backend built without GPU support (a CUDA host whose onnxruntime is the
    CPU wheel serves its ONNX models on the CPU, its PyTorch programs on the GPU)."""
    runtime = runtime_name(config, model_file)
    if runtime in (TENSORRT.backend, IDENTITY.backend):
        return ""  # GPU-only, or copies on the host wherever placed (as Triton's identity)
    if runtime == PT2.backend:
        from batchserve.backends.torch_archive import import_torch
        from batchserve.backends.torch_pt2 import gpu_problem

        return gpu_problem(import_torch(model_file), 0)
    try:
        import onnxruntime as ort
    except ImportError:
        return ""  # the load says what is missing
    from batchserve.backends.onnx_options import CUDA_EP

    if CUDA_EP in ort.get_available_providers():
        return ""
    return f"onnxruntime {ort.__version__} has no {CUDA_EP} (onnxruntime-gpu brings it)"


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
    if runtime == IDENTITY.backend:
        from batchserve.backends.identity import IdentityBackend

        return IdentityBackend()
    if runtime == TENSORRT.backend:
        from batchserve.backends.tensorrt import TensorRTBackend

        return TensorRTBackend()
    if runtime == PT2.backend:
        from batchserve.backends.torch_pt2 import TorchBackend

        return TorchBackend()
    from batchserve.backends.onnx import OnnxBackend

    return OnnxBackend(memory_limit_bytes=memory_limit_bytes)
