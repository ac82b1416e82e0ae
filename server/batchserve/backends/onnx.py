"""ONNX Runtime backend: one InferenceSession per instance, on the CPU or one GPU.

Execution providers and session options are chosen in ``onnx_options``; on a GPU, batches go
through ``onnx_io`` (buffers sized once, the instance's own CUDA stream, CUDA graphs when the
config asks). ORT's exceptions become batchserve's errors in one place, ``map_ort_errors``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import graph_batch_sizes, preferred_sizes
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.onnx_io import (
    BoundRunner,
    CudaMemory,
    HostMemory,
    IoLayout,
    Memory,
    fixed_rows,
)
from batchserve.backends.onnx_options import (
    CUDA_EP,
    TENSORRT_EP,
    ProviderPlan,
    choose_providers,
    session_options,
    tensorrt_profile,
    with_gpu_io,
)
from batchserve.backends.onnx_types import datatype_from_ort
from batchserve.core.datatypes import BYTES, DataType
from batchserve.core.device import CPU, Device
from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.devices import cuda
from batchserve.proto.model_config_pb2 import ModelConfig

_log = logging.getLogger(__name__)

_OOM = re.compile(
    r"Failed to allocate memory|bad allocation|std::bad_alloc|out of memory|BFCArena"
    r"|Available memory of \d+ is smaller than requested|ALLOC_FAILED",
    re.IGNORECASE,
)
_GRAPH_REFUSED = re.compile(r"graph capture|cuda graph", re.IGNORECASE)
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


def _tensor_spec(arg: Any, model_file: Path) -> TensorSpec:
    datatype = datatype_from_ort(arg.type)
    if datatype is None:
        raise ModelConfigError(f"{model_file}: tensor '{arg.name}' has unsupported type {arg.type}")
    dims = list(arg.shape or ())
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in dims)
    names = tuple(d if isinstance(d, str) else None for d in dims)
    return TensorSpec(arg.name, datatype, shape, names)


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


# What a GPU provider that cannot start raises from the session's constructor (CUDA_CALL_THROW,
# TensorRT libraries missing), as opposed to ORT's status errors for a bad model file.
_PROVIDER_FAILED = (RuntimeError, ort_state.EPFail)


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
            environment-registered CPU arena (``OrtArenaCfg.max_mem``) on the CPU. The I/O
            buffers ``onnx_io`` allocates once per GPU instance sit outside that arena.
        io_binding: bind inputs and outputs explicitly; None means on GPUs only.
    """

    def __init__(
        self, *, memory_limit_bytes: int | None = None, io_binding: bool | None = None
    ) -> None:
        self._memory_limit = memory_limit_bytes
        self._io_binding = io_binding
        self._session: Any = None
        self._runner: BoundRunner | None = None
        self._memory: Memory = HostMemory()
        self._device = CPU
        self._name = ""
        self._signature = ModelSignature((), ())
        self._run_options = _run_options()

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes this instance runs as captured CUDA graphs (empty without graphs)."""
        return () if self._runner is None else self._runner.graph_sizes

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        self._name = config.name or model_file.stem
        plan = choose_providers(
            ort.get_available_providers(),
            config,
            device,
            model_file=model_file,
            memory_limit_bytes=self._memory_limit,
        )
        setup = _GpuSetup.prepare(plan, config, model_file, self._io_binding is not False)
        try:
            self._load(model_file, config, setup)
        except BaseException:
            self._session = self._runner = None
            self._memory = HostMemory()
            setup.memory.close()
            raise

    def _load(self, model_file: Path, config: ModelConfig, setup: _GpuSetup) -> None:
        plan = setup.plan
        _make_cache_dirs(plan)
        session, plan = self._open_session(model_file, config, setup)
        for warning in (*plan.warnings, *setup.warnings):
            _log.warning(warning)
        on_gpu = plan.device.kind == "gpu"
        memory = setup.memory if on_gpu else HostMemory()
        self._signature, self._session, self._memory = (
            session_signature(session, model_file),
            session,
            memory,
        )
        self._device = plan.device
        if self._io_binding or (self._io_binding is None and on_gpu):
            layout = IoLayout.plan(self._signature, config.max_batch_size)
            sizes = setup.graph_sizes if on_gpu else ()
            where = f"model '{self._name}'"
            with _graph_hint(setup, model_file), map_ort_errors(where):
                self._runner = BoundRunner(session, layout, memory, _run_options, sizes, where)
                self._runner.capture_graphs()
        if memory is not setup.memory:  # fell back to the CPU: the GPU stream is not needed
            setup.memory.close()

    def _open_session(
        self, model_file: Path, config: ModelConfig, setup: _GpuSetup
    ) -> tuple[Any, ProviderPlan]:
        """A session running the plan, or, where the config allows it, one on the CPU."""
        plan = setup.plan
        cpu_limit = self._memory_limit if plan.device.kind == "cpu" else None
        with _graph_hint(setup, model_file), map_ort_errors(str(model_file), loading=True):
            try:
                session = _create_session(
                    model_file, session_options(config, model_file), plan, cpu_limit
                )
                problem = _plan_mismatch(session, plan)
            except _PROVIDER_FAILED as exc:
                if plan.device.kind != "gpu":
                    raise
                problem = _ORT_PREFIX.sub("", str(exc)).strip()
            if problem is None:
                return session, plan
            cpu_plan = _cpu_fallback(problem, plan, config, model_file)
            return _create_session(
                model_file, session_options(config, model_file), cpu_plan, None
            ), cpu_plan

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        names = list(output_names or (spec.name for spec in self._signature.outputs))
        self._check_dtypes(inputs)
        inputs = self._as_text(inputs)
        with map_ort_errors(f"model '{self._name}'"):
            if self._runner is not None:
                arrays = self._runner.run(inputs, names)
            else:
                arrays = session.run(names, dict(inputs), self._run_options)
        return dict(zip(names, arrays, strict=True))

    def memory_bytes(self) -> int | None:
        """None: ORT does not report its arenas (device measurement belongs to the caller)."""
        return None

    def unload(self) -> None:
        # The session goes first: it may compute on the stream the memory owns.
        runner, self._runner, self._session = self._runner, None, None
        if runner is not None:
            runner.close()
        memory, self._memory = self._memory, HostMemory()
        memory.close()

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

    def _as_text(self, inputs: Arrays) -> Arrays:
        """BYTES elements as str: ORT's Python binding turns a bytes object into its repr
        ("b'12'"), which a model parsing its strings then rejects or misreads."""
        strings = [
            name
            for name, array in inputs.items()
            if array.dtype.kind in "OS" and (spec := self._signature.input(name)) is not None
            and spec.datatype is BYTES
        ]  # fmt: skip
        if not strings:
            return inputs
        converted = dict(inputs)
        for name in strings:
            converted[name] = _decoded(inputs[name], name, self._name)
        return converted


def _decoded(array: np.ndarray, name: str, model: str) -> np.ndarray:
    flat = array.reshape(-1)
    try:
        items = [item.decode() if isinstance(item, bytes) else item for item in flat]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"model '{model}': input '{name}' holds BYTES that are not UTF-8, which ONNX "
            "Runtime's string tensors cannot carry"
        ) from None
    return np.fromiter(items, dtype=object, count=len(items)).reshape(array.shape)


def _run_options() -> Any:
    options = ort.RunOptions()
    # A failed run comes back as an exception, logged by whoever handles it; without
    # this ORT would also print every failure (each out-of-memory batch) to stderr.
    options.log_severity_level = 4
    return options


class _GpuSetup:
    """What an instance needs before its session exists: on a GPU, its stream and ORT options.

    Args:
        plan: the provider plan with the stream, graphs and TensorRT EP profile applied.
        memory: the instance's buffers (and stream): on the GPU with cuda-python, else host
            memory. It lives as long as the session, which may compute on its stream.
        graph_sizes: batch sizes to capture CUDA graphs for.
        warnings: why something the config asks for is not used.
    """

    def __init__(
        self,
        plan: ProviderPlan,
        memory: Memory,
        graph_sizes: tuple[int, ...] = (),
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.plan, self.memory = plan, memory
        self.graph_sizes, self.warnings = graph_sizes, warnings

    @classmethod
    def prepare(
        cls, plan: ProviderPlan, config: ModelConfig, model_file: Path, binds: bool
    ) -> _GpuSetup:
        if plan.device.kind != "gpu":
            ignored = config.optimization.cuda.graphs
            note = f"{model_file}: optimization.cuda.graphs is ignored on the CPU"
            return cls(plan, HostMemory(), warnings=(note,) if ignored else ())
        sizes = graph_batch_sizes(config, model_file)
        uses_trt = any(name == TENSORRT_EP for name, _ in plan.providers)
        signature = read_onnx_signature(model_file) if sizes or uses_trt else None
        warnings: list[str] = []
        if sizes and uses_trt:
            warnings.append(
                f"{model_file}: optimization.cuda.graphs is not used with the tensorrt "
                "accelerator: ONNX Runtime's TensorRT provider holds one CUDA graph per session "
                "and replays it whatever the batch size. Serve a TensorRT engine "
                "(batchserve export --tensorrt) for a graph per batch size"
            )
            sizes = ()
        if sizes and not (binds and _graphable(signature, config)):
            warnings.append(
                f"{model_file}: optimization.cuda.graphs needs I/O binding and every input "
                "and output fixed apart from the batch axis; running without CUDA graphs"
            )
            sizes = ()
        memory, problem = _gpu_memory(plan.device)
        if problem:
            warnings.append(f"{model_file}: {problem}")
        if sizes and not isinstance(memory, CudaMemory):
            _refuse_graphs_without_cuda_python(model_file, problem)
            sizes = ()  # no driver: the session's own failure reports the GPU as unusable
        plan = with_gpu_io(
            plan,
            stream=memory.stream.handle if isinstance(memory, CudaMemory) else None,
            cuda_graphs=bool(sizes),
            tensorrt_profile=_tensorrt_ep_profile(signature, config) if uses_trt else None,
        )
        return cls(plan, memory, sizes, tuple(warnings))


def _graphable(signature: ModelSignature | None, config: ModelConfig) -> bool:
    return signature is not None and IoLayout.plan(signature, config.max_batch_size).complete


def _tensorrt_ep_profile(signature: ModelSignature | None, config: ModelConfig) -> dict[str, str]:
    """An explicit profile when every input is fixed apart from the batch axis, else none."""
    if signature is None:
        return {}
    rows = [fixed_rows(spec) for spec in signature.inputs]
    fixed = [(r.name, r.row_shape) for r in rows if r is not None]
    if len(fixed) != len(rows):
        return {}
    return tensorrt_profile(fixed, config.max_batch_size, preferred_sizes(config))


def _gpu_memory(device: Device) -> tuple[Memory, str]:
    """CudaMemory for the device, or host memory and why not (ORT then does the copies)."""
    try:
        cuda.runtime()
    except DeviceUnavailable:
        return HostMemory(), (
            "cuda-python is not installed: ONNX Runtime copies every batch through pageable "
            "host memory on a stream of its own, without CUDA graphs; pip install "
            "'batchserve[gpu]' for pinned buffers and a stream per instance"
        )
    try:
        return CudaMemory(device.index), ""
    except DeviceUnavailable as exc:  # no driver: the session will say so too
        return HostMemory(), f"no CUDA stream on {device}: {exc.message}"


def _refuse_graphs_without_cuda_python(model_file: Path, problem: str) -> None:
    if problem.startswith("cuda-python is not installed"):
        raise DeviceUnavailable(
            f"{model_file}: optimization.cuda.graphs needs cuda-python, which is not installed "
            "(pip install 'batchserve[gpu]'), or set optimization { cuda { graphs: false } }"
        )


@contextmanager
def _graph_hint(setup: _GpuSetup, model_file: Path) -> Iterator[None]:
    """ORT refuses graph capture for models with nodes off the GPU: say how to go on."""
    try:
        yield
    except BatchserveError as exc:
        if not setup.graph_sizes or not _GRAPH_REFUSED.search(exc.message):
            raise
        config_file = model_file.parent.parent / "config.pbtxt"
        raise ModelConfigError(
            f"{exc.message}; CUDA graphs need every node on the GPU provider and no control "
            f"flow: set optimization {{ cuda {{ graphs: false }} }} in {config_file}"
        ) from exc


def _dtype_fits(dtype: np.dtype[Any], datatype: DataType) -> bool:
    if datatype is BYTES:
        return dtype.kind in ("O", "S", "U")
    return bool(dtype == datatype.numpy)


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
