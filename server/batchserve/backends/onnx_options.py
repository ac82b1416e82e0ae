"""Choosing ONNX Runtime's execution providers and session options from a model config.

Pure functions of what the installed wheel offers and what config.pbtxt asks for
(Triton's names and parameters), so every combination is testable without a GPU.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnxruntime as ort

from batchserve.backends.thread_counts import named_thread_count
from batchserve.core.cpu_budget import runtime_threads
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"
# Under the temporary directory, not beside the model: repositories are mounted read-only and
# containers run with a read-only root, while /tmp is writable (an emptyDir in the manifests).
TRT_CACHE_DIR = "batchserve-trt-cache"

ProviderSpec = tuple[str, dict[str, str]]

_CPU_ACCELERATORS = {
    "openvino": "OpenVINOExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
}
_GPU_ACCELERATORS = ("tensorrt", "cuda")
# Triton's TensorRT accelerator keys that ORT spells differently; other trt_* keys pass as-is.
_TRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_PRECISION = {
    "FP32": {},
    "FP16": {"trt_fp16_enable": "True"},
    "INT8": {"trt_int8_enable": "True"},
}


@dataclass(frozen=True, slots=True)
class ProviderPlan:
    """Execution providers in priority order, the device they run on, and what to warn about.

    Args:
        providers: (name, options) pairs as ``InferenceSession`` takes them.
        device: where the session runs; CPU when a GPU was asked for and fallback allowed.
        warnings: messages the caller logs (the choice itself stays pure).
    """

    providers: tuple[ProviderSpec, ...]
    device: Device
    warnings: tuple[str, ...] = ()


def choose_providers(
    available: Collection[str],
    config: ModelConfig,
    device: Device,
    *,
    model_file: Path,
    memory_limit_bytes: int | None = None,
) -> ProviderPlan:
    """Pick providers for ``device`` from ``available`` (``ort.get_available_providers()``)."""
    if device.kind == "cpu":
        return _cpu_plan(available, config, model_file)
    if CUDA_EP in available:
        return _gpu_plan(available, config, device, model_file, memory_limit_bytes)
    problem = (
        f"{model_file}: an instance on {device} needs onnxruntime's {CUDA_EP}, but this "
        f"onnxruntime offers only {', '.join(available) or 'no providers'}"
    )
    if not config.batchserve.allow_cpu_fallback:
        raise DeviceUnavailable(
            f"{problem}. Install the GPU build (pip install 'batchserve[gpu]', which brings "
            "onnxruntime-gpu in place of onnxruntime) and an NVIDIA driver, or set "
            "`batchserve { allow_cpu_fallback: true }` in config.pbtxt to run on the CPU"
        )
    plan = _cpu_plan(available, config, model_file)
    return replace(plan, warnings=(f"{problem}; running on the CPU", *plan.warnings))


def _cpu_plan(available: Collection[str], config: ModelConfig, model_file: Path) -> ProviderPlan:
    providers: list[ProviderSpec] = []
    warnings: list[str] = []
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        provider = _CPU_ACCELERATORS.get(accelerator.name)
        if provider is None:
            known = ", ".join(_CPU_ACCELERATORS)
            raise ModelConfigError(
                f"{model_file}: unknown cpu_execution_accelerator {accelerator.name!r} "
                f"(known: {known})"
            )
        if provider in available:
            providers.append((provider, dict(accelerator.parameters)))
        else:
            warnings.append(f"{model_file}: {provider} is not in this onnxruntime; skipping it")
    return ProviderPlan((*providers, (CPU_EP, {})), CPU, tuple(warnings))


def _gpu_plan(
    available: Collection[str],
    config: ModelConfig,
    device: Device,
    model_file: Path,
    memory_limit_bytes: int | None,
) -> ProviderPlan:
    accelerators = _gpu_accelerators(config, model_file)
    providers: list[ProviderSpec] = []
    warnings: list[str] = []
    if "tensorrt" in accelerators and TENSORRT_EP in available:
        providers.append(
            (TENSORRT_EP, _tensorrt_options(accelerators["tensorrt"], device, model_file))
        )
    elif "tensorrt" in accelerators:
        warnings.append(f"{model_file}: {TENSORRT_EP} is not in this onnxruntime; using CUDA only")
    cuda_options = (
        _cuda_options(device, memory_limit_bytes)
        | _cuda_parameters(config, model_file)
        | accelerators.get("cuda", {})
    )
    providers += [(CUDA_EP, cuda_options), (CPU_EP, {})]
    return ProviderPlan(tuple(providers), device, tuple(warnings))


def _gpu_accelerators(config: ModelConfig, model_file: Path) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if accelerator.name not in _GPU_ACCELERATORS:
            raise ModelConfigError(
                f"{model_file}: unknown gpu_execution_accelerator {accelerator.name!r} "
                f"(known: {', '.join(_GPU_ACCELERATORS)})"
            )
        found[accelerator.name] = dict(accelerator.parameters)
    return found


def _tensorrt_options(
    params: Mapping[str, str], device: Device, model_file: Path
) -> dict[str, str]:
    options = {
        "device_id": str(device.index),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(default_engine_cache(model_file)),
    }
    for key, value in params.items():
        if key == "precision_mode" and value.upper() in _TRT_PRECISION:
            options |= _TRT_PRECISION[value.upper()]
        elif key in _TRT_RENAMED or key.startswith("trt_"):
            renamed = _TRT_RENAMED.get(key, key)
            options[renamed] = _trt_boolean(value) if _is_trt_flag(renamed) else value
        else:
            raise ModelConfigError(
                f"{model_file}: tensorrt accelerator parameter {key}={value!r} is not supported "
                f"(precision_mode is one of {', '.join(_TRT_PRECISION)}; other keys start trt_)"
            )
    return options


# TensorRT EP options that are switches, beyond the *_enable ones.
_TRT_FLAGS = {
    "trt_dump_subgraphs",
    "trt_force_sequential_engine_build",
    "trt_force_timing_cache",
    "trt_detailed_build_log",
    "trt_layer_norm_fp32_fallback",
    "trt_int8_use_native_calibration_table",
    "trt_dump_ep_context_model",
}
_BOOLEANS = {"1": "True", "true": "True", "0": "False", "false": "False"}


def _is_trt_flag(key: str) -> bool:
    return key.endswith("_enable") or key in _TRT_FLAGS


def _trt_boolean(value: str) -> str:
    """Triton's configs write switches as "1" or "true"; the TensorRT EP takes only True/False."""
    return _BOOLEANS.get(value.strip().lower(), value)


def default_engine_cache(model_file: Path) -> Path:
    """``<tmp>/batchserve-trt-cache/<model>/<version>``: writable wherever the server runs."""
    version_dir = model_file.parent
    return Path(tempfile.gettempdir(), TRT_CACHE_DIR, version_dir.parent.name, version_dir.name)


def with_gpu_io(
    plan: ProviderPlan,
    *,
    stream: int | None = None,
    cuda_graphs: bool = False,
    tensorrt_profile: Mapping[str, str] | None = None,
) -> ProviderPlan:
    """The GPU plan with the instance's stream, CUDA graphs and a TensorRT EP profile applied.

    Args:
        stream: the instance's own ``cudaStream_t``; ORT computes on it
            (``user_compute_stream``) instead of a stream of its choosing. The CUDA EP also
            takes ``has_user_compute_stream``; the TensorRT EP's parser rejects that key and
            sets the flag itself from ``user_compute_stream``.
        cuda_graphs: capture CUDA graphs on the CUDA EP (``enable_cuda_graph``, one
            ``gpu_graph_id`` per batch size). Callers leave it off when the TensorRT EP is in
            the plan: that EP holds one graph per session and replays it whatever the shape.
        tensorrt_profile: ``trt_profile_*_shapes`` for the TensorRT EP, unless the
            accelerator's parameters already set any of them.
    """
    if plan.device.kind != "gpu":
        return plan
    names = [name for name, _ in plan.providers]
    providers: list[ProviderSpec] = []
    for name, given in plan.providers:
        options = dict(given)
        if stream is not None and name == CUDA_EP:
            options |= {"has_user_compute_stream": "1", "user_compute_stream": str(stream)}
        elif stream is not None and name == TENSORRT_EP:
            options["user_compute_stream"] = str(stream)
        if name == TENSORRT_EP:
            if tensorrt_profile and not any(key in options for key in _TRT_PROFILE_KEYS):
                options |= tensorrt_profile
        elif name == CUDA_EP and cuda_graphs and TENSORRT_EP not in names:
            options["enable_cuda_graph"] = "1"
        providers.append((name, options))
    return replace(plan, providers=tuple(providers))


_TRT_PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")


def tensorrt_profile(
    inputs: Sequence[tuple[str, Sequence[int]]], max_batch: int, preferred: Sequence[int]
) -> dict[str, str]:
    """One explicit TensorRT EP profile: batch 1..max_batch, tuned for the largest preferred size.

    ``inputs`` are (name, shape without the batch axis) pairs, every axis fixed. Without an
    explicit profile the TensorRT EP builds an engine for the shapes it has seen and rebuilds
    it, mid-traffic, whenever a larger batch arrives. The EP's profile cannot follow each
    preferred size the way ``batchserve export --tensorrt`` does, so it is tuned for the
    largest: the size the batcher reaches under load.
    """
    if max_batch < 1 or not inputs:
        return {}
    opt = max((size for size in preferred if 1 <= size <= max_batch), default=max_batch)

    def shapes(batch: int) -> str:
        return ",".join(f"{name}:{'x'.join(map(str, (batch, *dims)))}" for name, dims in inputs)

    return dict(zip(_TRT_PROFILE_KEYS, (shapes(1), shapes(opt), shapes(max_batch)), strict=True))


def _cuda_options(device: Device, memory_limit_bytes: int | None) -> dict[str, str]:
    options = {
        "device_id": str(device.index),
        # Grow by what is asked, not to the next power of two: the budget is measured.
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "True",
        # ORT computes FP32 MatMul and Conv in TF32 by default (a 10-bit mantissa): an FP32
        # model must give FP32 results, as verified on the CPU. A cuda accelerator parameter
        # use_tf32=1 opts in.
        "use_tf32": "0",
        # ORT's default EXHAUSTIVE search benchmarks cuDNN on the first batch of every new
        # size, a latency spike per batch size in traffic; Triton's parameter overrides it.
        "cudnn_conv_algo_search": "HEURISTIC",
    }
    if memory_limit_bytes is not None:
        options["gpu_mem_limit"] = str(memory_limit_bytes)
    return options


# Triton's ONNX Runtime backend takes cudnn_conv_algo_search as an integer in `parameters`.
_CONV_ALGO_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}


def _cuda_parameters(config: ModelConfig, model_file: Path) -> dict[str, str]:
    """CUDA EP options from config.pbtxt ``parameters``, under Triton's names where it has one."""
    params = {key: value.string_value for key, value in config.parameters.items()}
    options: dict[str, str] = {}
    if "cudnn_conv_algo_search" in params:
        value = params["cudnn_conv_algo_search"].strip()
        if value not in _CONV_ALGO_SEARCH:
            raise ModelConfigError(
                f"{model_file}: parameter cudnn_conv_algo_search={value!r} is not 0 "
                "(exhaustive), 1 (heuristic) or 2 (default)"
            )
        options["cudnn_conv_algo_search"] = _CONV_ALGO_SEARCH[value]
    if "use_tf32" in params:
        options["use_tf32"] = "1" if _flag_param(params, "use_tf32", False, model_file) else "0"
    return options


# Triton's optimization.graph.level: -1 basic, 0 (default) all, 1 extended, 2 none.
_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def session_options(config: ModelConfig, model_file: Path) -> Any:
    """SessionOptions from config.pbtxt, using Triton's ONNX backend parameter names."""
    level = config.optimization.graph.level
    if level not in _GRAPH_LEVELS:  # Triton's backend takes any other level as 0
        logger.warning(
            "%s: optimization.graph.level %d is not one of -1, 0, 1, 2: every optimization "
            "is on, as with 0 (as Triton's ONNX Runtime backend reads it)",
            model_file,
            level,
        )
    params = {key: value.string_value for key, value in config.parameters.items()}
    options = ort.SessionOptions()
    options.logid = config.name or model_file.stem
    options.graph_optimization_level = _GRAPH_LEVELS.get(level, _GRAPH_LEVELS[0])
    # Left to itself ORT sizes and pins its pools by the host's cores, not by the CPUs this
    # process may use (``core/cpu_budget.runtime_threads``): a count it is given pins nothing.
    threads = runtime_threads()
    intra = named_thread_count(params, "intra_op_thread_count", model_file)
    inter = named_thread_count(params, "inter_op_thread_count", model_file)
    options.intra_op_num_threads = intra or threads
    options.inter_op_num_threads = inter or threads
    if _flag_param(params, "execution_mode", False, model_file):
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.enable_mem_pattern = _flag_param(
        params, "enable_mem_pattern", not shapes_vary(config), model_file
    )
    options.enable_cpu_mem_arena = _flag_param(params, "enable_mem_arena", True, model_file)
    # ORT's pool threads busy-wait between operators by default. In a server they then
    # spin between batches too, taking the cores the event loop needs: measured on the
    # 2-core reference machine, spinning doubled the server's CPU per request at equal
    # throughput (bench/NOTES.md). Off unless the model's config asks for it.
    spinning = "1" if _flag_param(params, "allow_spinning", False, model_file) else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    return options


def shapes_vary(config: ModelConfig) -> bool:
    """Whether the model's input shapes change from run to run (a batch axis or a free one).

    ORT's memory pattern, on by default there and in Triton, traces a shape's allocations on
    its first run and allocates them as one block from the next run on, while its arena keeps
    the first run's blocks too. Where shapes vary, every new shape pays that again and the
    arena holds both: a two-convolution CNN held 617 MiB after its 64-row batch ran twice with
    the pattern, 353 MiB without, and no model timed ran faster with it beyond the host's
    noise (``bench/NOTES.md``). So the pattern is left on only for fixed shapes.
    """
    return config.max_batch_size > 0 or any(d < 0 for t in config.input for d in t.dims)


def _flag_param(params: Mapping[str, str], key: str, default: bool, model_file: Path) -> bool:
    if key not in params:
        return default
    value = params[key].strip().lower()
    if value not in _FLAGS:
        raise ModelConfigError(f"{model_file}: parameter {key}={params[key]!r} is not 0 or 1")
    return _FLAGS[value]
