"""Creating an ONNX Runtime session that runs what the provider plan says, or says why not.

ORT left to itself rebuilds a session whose GPU provider failed on the CPU, without a word;
here a session either runs the planned providers on the planned device, or, where the config
allows it, is rebuilt on the CPU explicitly, with a warning. The CPU arena cap is registered
here too, as it must be registered just before the session that uses it is created.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import threading
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from batchserve.backends.onnx_errors import ort_message
from batchserve.backends.onnx_options import (
    CUDA_EP,
    ProviderPlan,
    choose_providers,
    session_options,
)
from batchserve.backends.onnx_types import datatype_from_ort
from batchserve.core.device import CPU
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.proto.model_config_pb2 import ModelConfig

# Warnings go out under the backend's name, where they always did.
_log = logging.getLogger("batchserve.backends.onnx")

# The CPU arena cap is an allocator registered with ORT's process-wide environment; each
# registration replaces it for sessions created afterwards, so register-and-create is atomic.
_ENV_ALLOCATOR_LOCK = threading.Lock()

# What a GPU provider that cannot start raises from the session's constructor (CUDA_CALL_THROW,
# TensorRT libraries missing), as opposed to ORT's status errors for a bad model file.
_PROVIDER_FAILED = (RuntimeError, ort_state.EPFail)


def open_session(
    model_file: Path, config: ModelConfig, plan: ProviderPlan, cpu_limit: int | None
) -> tuple[Any, ProviderPlan]:
    """A session running ``plan``, or, where the config allows it, one on the CPU, and the
    plan it runs. ORT's exceptions go out as they are: the caller maps them."""
    try:
        session = _create_session(model_file, session_options(config, model_file), plan, cpu_limit)
        problem = _plan_mismatch(session, plan)
    except _PROVIDER_FAILED as exc:
        if plan.device.kind != "gpu":
            raise
        problem = ort_message(exc)
    if problem is None:
        return session, plan
    cpu_plan = _cpu_fallback(problem, plan, config, model_file)
    return _create_session(
        model_file, session_options(config, model_file), cpu_plan, None
    ), cpu_plan


def session_signature(session: Any, model_file: Path) -> ModelSignature:
    """Inputs and outputs as the session sees them (symbolic dims are DYNAMIC, names kept)."""
    inputs = tuple(_tensor_spec(arg, model_file) for arg in session.get_inputs())
    outputs = tuple(_tensor_spec(arg, model_file) for arg in session.get_outputs())
    return ModelSignature(inputs, outputs)


def _tensor_spec(arg: Any, model_file: Path) -> TensorSpec:
    datatype = datatype_from_ort(arg.type)
    if datatype is None:
        raise ModelConfigError(f"{model_file}: tensor '{arg.name}' has unsupported type {arg.type}")
    dims = list(arg.shape or ())
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in dims)
    names = tuple(d if isinstance(d, str) else None for d in dims)
    return TensorSpec(arg.name, datatype, shape, names)


def make_cache_dirs(plan: ProviderPlan) -> None:
    """Create the TensorRT provider's engine cache, saying which setting to change if it
    cannot be created."""
    for _, options in plan.providers:
        cache = options.get("trt_engine_cache_path")
        if cache is None:
            continue
        try:
            Path(cache).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelConfigError(
                f"cannot create TensorRT engine cache {cache}: {exc.strerror}; set the "
                "tensorrt accelerator's trt_engine_cache_path to a writable directory"
            ) from None


def _register_cpu_arena(memory_limit_bytes: int, model_file: Path) -> None:
    if memory_limit_bytes <= model_file.stat().st_size:
        # ORT reserves the weights in the arena past the cap, after which the cap stops working.
        raise ModelConfigError(
            f"{model_file}: memory limit {memory_limit_bytes} bytes does not exceed the model's "
            f"{model_file.stat().st_size}-byte file; a CPU arena cap must hold the weights"
        )
    info = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    arena = ort.OrtArenaCfg({"max_mem": memory_limit_bytes, "arena_extend_strategy": 1})
    ort.create_and_register_allocator(info, arena)


@functools.cache
def _one_onnxruntime() -> None:
    """Refuse an install holding both ONNX Runtime wheels: each overwrites the other's module."""
    installed = []
    for distribution in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            installed.append(f"{distribution} {metadata.version(distribution)}")
    if len(installed) > 1:
        raise DeviceUnavailable(
            f"both {' and '.join(installed)} are installed; they install the same module and the "
            "last one installed wins. pip uninstall -y onnxruntime onnxruntime-gpu, then "
            "pip install 'batchserve[cpu]' or 'batchserve[gpu]', not both"
        )


@functools.cache
def _preload_cuda_wheels() -> None:
    """Load the CUDA and cuDNN libraries pip installed before the first GPU session.

    onnxruntime-gpu[cuda,cudnn] brings them as ``nvidia-*`` wheels, whose directories the
    dynamic loader does not search; a host with CUDA installed system-wide needs nothing.
    """
    if importlib.util.find_spec("nvidia") is None or not hasattr(ort, "preload_dlls"):
        return
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # it prints its failures
        ort.preload_dlls()
    for line in said.getvalue().splitlines():
        _log.warning("onnxruntime.preload_dlls: %s", line)


def _create_session(
    model_file: Path, options: Any, plan: ProviderPlan, cpu_limit: int | None
) -> Any:
    _one_onnxruntime()
    if plan.device.kind == "gpu":
        _preload_cuda_wheels()
    names = [name for name, _ in plan.providers]
    provider_options = [opts for _, opts in plan.providers]
    with _ENV_ALLOCATOR_LOCK:
        if cpu_limit is not None:
            _register_cpu_arena(cpu_limit, model_file)
            options.add_session_config_entry("session.use_env_allocators", "1")
        # Without enable_fallback=0, ORT answers a provider that fails to start by rebuilding
        # the session on CUDA or the CPU with no provider options at all (device 0, no memory
        # cap, no stream). Versions without the keyword ignore it; _plan_mismatch covers them.
        session = ort.InferenceSession(
            str(model_file),
            options,
            providers=names,
            provider_options=provider_options,
            enable_fallback=0,
        )
    session.disable_fallback()  # a failing GPU run must fail, not silently rerun on the CPU
    return session


def _plan_mismatch(session: Any, plan: ProviderPlan) -> str | None:
    """Why the session does not run the planned GPU providers on the planned device, if not."""
    if plan.device.kind != "gpu":
        return None
    wanted = [name for name, _ in plan.providers]
    running = list(session.get_providers())
    if running != wanted:
        return f"onnxruntime runs {', '.join(running)} instead of {', '.join(wanted)}"
    device_id = session.get_provider_options().get(CUDA_EP, {}).get("device_id")
    if device_id != str(plan.device.index):
        return f"onnxruntime placed {CUDA_EP} on device {device_id}, not {plan.device}"
    return None


def _cpu_fallback(
    problem: str, plan: ProviderPlan, config: ModelConfig, model_file: Path
) -> ProviderPlan:
    """The CPU plan when the config allows falling back, else the GPU's failure, explained."""
    failure = f"{model_file}: onnxruntime could not start {CUDA_EP} on {plan.device}: {problem}"
    if not config.batchserve.allow_cpu_fallback:
        raise DeviceUnavailable(
            f"{failure}. onnxruntime-gpu needs an NVIDIA driver with CUDA 13 and cuDNN 9 "
            "(pip install 'batchserve[gpu]' brings them as wheels), and the TensorRT "
            "accelerator needs TensorRT 10; or set `batchserve { allow_cpu_fallback: true }`"
        )
    cpu_plan = choose_providers(ort.get_available_providers(), config, CPU, model_file=model_file)
    return replace(
        cpu_plan, warnings=(*plan.warnings, f"{failure}; running on the CPU", *cpu_plan.warnings)
    )
