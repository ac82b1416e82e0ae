"""ONNX Runtime backend: one InferenceSession per instance, on the CPU or one GPU.

Execution providers and session options are chosen in ``onnx_options``. ORT's
exceptions become batchserve's errors in one place, ``map_ort_errors``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from batchserve.backends.base import Arrays
from batchserve.backends.onnx_options import (
    CUDA_EP,
    ProviderPlan,
    choose_providers,
    session_options,
)
from batchserve.datatypes import BY_WIRE, BYTES, DataType
from batchserve.devices import CPU, Device
from batchserve.errors import (
    BackendError,
    BatchserveError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.grpc.generated.model_config_pb2 import ModelConfig
from batchserve.signature import DYNAMIC, ModelSignature, TensorSpec

_log = logging.getLogger(__name__)

_OOM = re.compile(
    r"Failed to allocate memory|bad allocation|std::bad_alloc|out of memory|BFCArena"
    r"|Available memory of \d+ is smaller than requested|ALLOC_FAILED",
    re.IGNORECASE,
)
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# ORT's own classes for a bad model file, as opposed to a failing runtime.
_BAD_MODEL = (
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NoModel,
    ort_state.NotImplemented,
    ort_state.Fail,
)


def translate_ort_error(error: Exception, where: str, *, loading: bool = False) -> BatchserveError:
    """The batchserve error for an exception ONNX Runtime raised; ``where`` names model or file."""
    message = f"{where}: {_ORT_PREFIX.sub('', str(error)).strip()}"
    if isinstance(error, MemoryError) or _OOM.search(str(error)):
        return OutOfMemory(message)
    if loading and isinstance(error, (*_BAD_MODEL, OSError)):
        return ModelConfigError(message)
    if not loading and isinstance(error, ort_state.InvalidArgument | ValueError):
        return InvalidArgument(message)
    return BackendError(message)


@contextmanager
def map_ort_errors(where: str, *, loading: bool = False) -> Iterator[None]:
    """The one boundary where ONNX Runtime's exceptions become batchserve's."""
    try:
        yield
    except BatchserveError:
        raise
    except Exception as exc:
        raise translate_ort_error(exc, where, loading=loading) from exc


_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}


def _tensor_spec(arg: Any, model_file: Path) -> TensorSpec:
    wire = _ORT_TYPES.get(arg.type)
    if wire is None:
        raise ModelConfigError(f"{model_file}: tensor '{arg.name}' has unsupported type {arg.type}")
    dims = list(arg.shape or ())
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in dims)
    names = tuple(d if isinstance(d, str) else None for d in dims)
    return TensorSpec(arg.name, BY_WIRE[wire], shape, names)


def session_signature(session: Any, model_file: Path) -> ModelSignature:
    """Inputs and outputs as the session sees them (symbolic dims are DYNAMIC, names kept)."""
    inputs = tuple(_tensor_spec(arg, model_file) for arg in session.get_inputs())
    outputs = tuple(_tensor_spec(arg, model_file) for arg in session.get_outputs())
    return ModelSignature(inputs, outputs)


# The CPU arena cap is an allocator registered with ORT's process-wide environment; each
# registration replaces it for sessions created afterwards, so register-and-create is atomic.
_ENV_ALLOCATOR_LOCK = threading.Lock()


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


def _create_session(
    model_file: Path, options: Any, plan: ProviderPlan, cpu_limit: int | None
) -> Any:
    names = [name for name, _ in plan.providers]
    provider_options = [opts for _, opts in plan.providers]
    with _ENV_ALLOCATOR_LOCK:
        if cpu_limit is not None:
            _register_cpu_arena(cpu_limit, model_file)
            options.add_session_config_entry("session.use_env_allocators", "1")
        session = ort.InferenceSession(
            str(model_file), options, providers=names, provider_options=provider_options
        )
    session.disable_fallback()  # a failing GPU run must fail, not silently rerun on the CPU
    return session


def _make_cache_dirs(plan: ProviderPlan) -> None:
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


class OnnxBackend:
    """One ONNX Runtime session on one device.

    Args:
        memory_limit_bytes: cap on the session's memory arena: ``gpu_mem_limit`` on a GPU, an
            environment-registered CPU arena (``OrtArenaCfg.max_mem``) on the CPU.
        io_binding: bind inputs and outputs explicitly; None means on GPUs only.
    """

    def __init__(
        self, *, memory_limit_bytes: int | None = None, io_binding: bool | None = None
    ) -> None:
        self._memory_limit = memory_limit_bytes
        self._io_binding = io_binding
        self._session: Any = None
        self._device = CPU
        self._name = ""
        self._signature = ModelSignature((), ())
        # A failed run comes back as an exception, logged by whoever handles it; without
        # this ORT would also print every failure (each out-of-memory batch) to stderr.
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        self._name = config.name or model_file.stem
        plan = choose_providers(
            ort.get_available_providers(),
            config,
            device,
            model_file=model_file,
            memory_limit_bytes=self._memory_limit,
        )
        _make_cache_dirs(plan)
        options = session_options(config, model_file)
        cpu_limit = self._memory_limit if plan.device.kind == "cpu" else None
        with map_ort_errors(str(model_file), loading=True):
            session = _create_session(model_file, options, plan, cpu_limit)
        plan = _confirm_gpu(session, plan, config, model_file)
        for warning in plan.warnings:
            _log.warning(warning)
        self._signature = session_signature(session, model_file)
        self._session, self._device = session, plan.device

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        names = list(output_names or (spec.name for spec in self._signature.outputs))
        self._check_dtypes(inputs)
        with map_ort_errors(f"model '{self._name}'"):
            if self._binds():
                arrays = _run_bound(session, inputs, names, self._device, self._run_options)
            else:
                arrays = session.run(names, dict(inputs), self._run_options)
        return dict(zip(names, arrays, strict=True))

    def memory_bytes(self) -> int | None:
        """None: ORT does not report its arenas (device measurement belongs to the caller)."""
        return None

    def unload(self) -> None:
        self._session = None

    def _binds(self) -> bool:
        return self._device.kind == "gpu" if self._io_binding is None else self._io_binding

    def _check_dtypes(self, inputs: Arrays) -> None:
        # ORT's own dtype error does not name the tensor; this does, at no per-element cost.
        for name, array in inputs.items():
            spec = self._signature.input(name)
            if spec is None or _dtype_fits(array.dtype, spec.datatype):
                continue
            raise InvalidArgument(
                f"model '{self._name}': input '{name}' has numpy dtype {array.dtype}, "
                f"but the model expects {spec.datatype.wire}"
            )


def _dtype_fits(dtype: np.dtype[Any], datatype: DataType) -> bool:
    if datatype is BYTES:
        return dtype.kind in ("O", "S", "U")
    return bool(dtype == datatype.numpy)


def _run_bound(
    session: Any, inputs: Arrays, names: list[str], device: Device, run_options: Any
) -> list[Any]:
    binding = session.io_binding()
    # bind_cpu_input keeps no reference: the contiguous copies must outlive the run.
    held = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
    for name, array in held.items():
        binding.bind_cpu_input(name, array)
    target = "cuda" if device.kind == "gpu" else "cpu"
    for name in names:
        binding.bind_output(name, target, device.index)
    session.run_with_iobinding(binding, run_options)
    return list(binding.copy_outputs_to_cpu())


def _confirm_gpu(
    session: Any, plan: ProviderPlan, config: ModelConfig, model_file: Path
) -> ProviderPlan:
    """ORT quietly drops a GPU provider it cannot start (no driver): check it really runs."""
    if plan.device.kind == "cpu" or CUDA_EP in session.get_providers():
        return plan
    problem = (
        f"{model_file}: onnxruntime could not start {CUDA_EP} on {plan.device} "
        "(no NVIDIA driver, or CUDA/cuDNN libraries missing)"
    )
    if not config.batchserve.allow_cpu_fallback:
        raise DeviceUnavailable(
            f"{problem}; install the NVIDIA driver and the CUDA 12 runtime libraries that "
            "onnxruntime-gpu needs, or set `batchserve { allow_cpu_fallback: true }`"
        )
    return replace(plan, device=CPU, warnings=(*plan.warnings, f"{problem}; running on the CPU"))
