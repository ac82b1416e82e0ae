"""TensorRT backend: a deserialised engine with one execution context and CUDA stream per instance.

Buffers are sized once at load for the largest shapes of every optimisation profile the
instance may use, so a batch never allocates: inputs go through pinned host buffers to the
device on the instance's own stream, outputs come back the same way, and every buffer is
reused by the next batch. Each batch runs on the profile tuned nearest its size. With
``optimization { cuda { graphs: true } }`` a CUDA graph is captured per preferred batch size
and a batch is padded up to the next one. ``tensorrt`` and cuda-python are imported inside
functions; without them, or without a GPU, load says which is missing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import graph_batch_sizes, padded_batch
from batchserve.backends.tensorrt_profiles import (
    EngineTensor,
    Profile,
    check_inputs,
    datatype_from_trt,
    instance_profiles,
    pick_profile,
    union_tensor,
)
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
from batchserve.devices.placement import gpu_count
from batchserve.proto.model_config_pb2 import ModelConfig

__all__ = [
    "EngineTensor",
    "TensorRTBackend",
    "check_inputs",
    "datatype_from_trt",
    "instance_profiles",
    "map_trt_errors",
    "pick_profile",
    "read_engine_signature",
]

_log = logging.getLogger(__name__)


def _import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError:
        return None
    return tensorrt


def _require_gpu(path: Path, device: Device | None) -> Any:
    """The tensorrt module, once the package, cuda-python and a usable GPU are all present."""
    trt = _import_tensorrt()
    problems = [] if trt is not None else ["the tensorrt package is not installed"]
    try:
        cuda.runtime()
    except DeviceUnavailable:
        problems.append("cuda-python (>= 12.6.2) is not installed")
    count = gpu_count()
    if count == 0:
        problems.append("no NVIDIA GPU is visible (no driver, or none exposed to this process)")
    elif device is not None and (device.kind != "gpu" or device.index >= count):
        problems.append(f"the instance is placed on {device}, but this machine has {count} GPU(s)")
    if problems:
        raise DeviceUnavailable(
            f"{path}: a TensorRT engine needs TensorRT, cuda-python and an NVIDIA GPU, but "
            f"{'; '.join(problems)}. Install them with pip install 'batchserve[gpu]' on a machine "
            "with an NVIDIA GPU and driver (instance_group KIND_GPU), or serve the ONNX model"
        )
    return trt


_LOGGERS: dict[int, Any] = {}  # one TensorRT logger per process, alive as long as engines are


def _deserialize(trt: Any, path: Path) -> tuple[Any, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc.strerror}") from None
    logger = _LOGGERS.setdefault(0, trt.Logger(trt.Logger.WARNING))
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise ModelConfigError(
            f"{path}: TensorRT {trt.__version__} cannot deserialise this engine; an engine loads "
            "only with the TensorRT version and GPU model that built it, so rebuild it here"
        )
    return runtime, engine


def _io_names(trt: Any, engine: Any) -> tuple[list[str], list[str]]:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    return inputs, [n for n in names if n not in inputs]


def _engine_spec(engine: Any, name: str, path: Path) -> TensorSpec:
    shape = tuple(d if d >= 0 else DYNAMIC for d in engine.get_tensor_shape(name))
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return TensorSpec(name, datatype, shape, (None,) * len(shape))


def _engine_signature(trt: Any, engine: Any, path: Path) -> ModelSignature:
    inputs, outputs = _io_names(trt, engine)
    return ModelSignature(
        tuple(_engine_spec(engine, n, path) for n in inputs),
        tuple(_engine_spec(engine, n, path) for n in outputs),
    )


def read_engine_signature(path: Path) -> ModelSignature:
    """Inputs and outputs of a serialised engine (dynamic dims are DYNAMIC); needs a GPU."""
    trt = _require_gpu(path, None)
    _, engine = _deserialize(trt, path)
    return _engine_signature(trt, engine, path)


def _profile_input(engine: Any, name: str, profile: int, path: Path) -> tuple[EngineTensor, int]:
    """The input's range under ``profile``, and the batch size the profile was tuned for."""
    if engine.is_shape_inference_io(name):
        raise ModelConfigError(f"{path}: input '{name}' is a shape tensor, which is unsupported")
    shape = tuple(engine.get_tensor_shape(name))
    low = opt = high = shape
    if DYNAMIC in shape:
        low, opt, high = (tuple(s) for s in engine.get_tensor_profile_shape(name, profile))
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, True, low, high), (opt[0] if opt else 1)


def _output_tensor(engine: Any, context: Any, name: str, path: Path) -> EngineTensor:
    shape = tuple(context.get_tensor_shape(name))  # after every input was set to its maximum
    if any(d < 0 for d in shape):
        raise ModelConfigError(f"{path}: output '{name}' has a data-dependent shape, unsupported")
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, False, shape, shape)


@dataclass(frozen=True, slots=True)
class _CapturedGraph:
    """A CUDA graph for one padded batch size, its own context, and the output shapes."""

    graph: cuda.Graph
    context: Any  # never reshaped after capture: the graph replays what it held then
    outputs: dict[str, tuple[int, ...]]


def _scratch_bytes(engine: Any) -> int:
    size = getattr(engine, "device_memory_size_v2", None)  # TensorRT >= 10.1
    return int(engine.device_memory_size if size is None else size)


class _Instance:
    """What one loaded instance owns on the GPU; ``close`` frees it all and may run twice.

    One execution context per optimisation profile (and one per CUDA graph), so a batch
    never switches a context's profile. They share one scratch buffer: the instance runs
    one batch at a time on its one stream, so no two of them use it at once.
    """

    def __init__(self, runtime: Any, engine: Any) -> None:
        self.runtime, self.engine = runtime, engine
        self.stream = cuda.Stream()
        self.scratch: cuda.DeviceBuffer | None = None
        self.profiles: list[Profile] = []
        self.contexts: dict[int, Any] = {}
        self.tensors: dict[str, EngineTensor] = {}
        self.device_buffers: dict[str, cuda.DeviceBuffer] = {}
        self.host_buffers: dict[str, cuda.PinnedBuffer] = {}
        self.graphs: dict[int, _CapturedGraph] = {}

    def open(self, trt: Any, profiles: Sequence[int], path: Path) -> None:
        self.scratch = cuda.DeviceBuffer(_scratch_bytes(self.engine))
        input_names, output_names = _io_names(trt, self.engine)
        _require_linear(trt, self.engine, [*input_names, *output_names], path)
        outputs: dict[str, list[EngineTensor]] = {name: [] for name in output_names}
        for index in profiles:
            profile = self._describe(index, input_names, path)
            context = self._context(trt, index, path)
            for tensor in profile.inputs.values():
                if not context.set_input_shape(tensor.name, tensor.max_shape):
                    raise ModelConfigError(f"{path}: TensorRT rejects profile {index}'s maximum")
            for name in output_names:
                outputs[name].append(_output_tensor(self.engine, context, name, path))
            self.profiles.append(profile)
            self.contexts[index] = context
        for name in input_names:
            self.tensors[name] = union_tensor([p.inputs[name] for p in self.profiles])
        for name, per_profile in outputs.items():
            self.tensors[name] = union_tensor(per_profile)
        for tensor in self.tensors.values():
            self.device_buffers[tensor.name] = cuda.DeviceBuffer(tensor.max_bytes)
            self.host_buffers[tensor.name] = cuda.PinnedBuffer(tensor.max_bytes)
            # Rows past a padded batch hold zeros or earlier rows, never uninitialised memory.
            cuda.memset_async(self.device_buffers[tensor.name], 0, self.stream)
        for context in self.contexts.values():
            self._bind(context, path)
        self.stream.synchronize()

    def _describe(self, index: int, input_names: Sequence[str], path: Path) -> Profile:
        described = [_profile_input(self.engine, n, index, path) for n in input_names]
        opt = max((batch for _, batch in described), default=1)
        return Profile(index, {t.name: t for t, _ in described}, opt)

    def _context(self, trt: Any, profile: int, path: Path) -> Any:
        """A context on ``profile`` without memory of its own (it uses the shared scratch)."""
        assert self.scratch is not None
        strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
        context = self.engine.create_execution_context(strategy)
        if context is None:
            raise OutOfMemory(f"{path}: TensorRT could not create an execution context")
        if hasattr(context, "set_device_memory"):  # TensorRT >= 10.1
            context.set_device_memory(self.scratch.pointer, self.scratch.nbytes)
        else:
            context.device_memory = self.scratch.pointer
        if not context.set_optimization_profile_async(profile, self.stream.handle):
            raise ModelConfigError(f"{path}: cannot select optimisation profile {profile}")
        return context

    def _bind(self, context: Any, where: Path | str) -> None:
        for name, buffer in self.device_buffers.items():
            if not context.set_tensor_address(name, buffer.pointer):
                raise BackendError(f"{where}: TensorRT refused the buffer of '{name}'")

    def capture_graphs(self, trt: Any, sizes: Sequence[int], path: Path) -> list[str]:
        """Capture a CUDA graph per batch size; returns why sizes were left out."""
        inputs = [t for t in self.tensors.values() if t.is_input]
        if sizes and not all(_batch_only(t) for t in inputs):
            return [f"{path}: CUDA graphs need every input fixed apart from the batch axis"]
        skipped: list[str] = []
        for size in sizes:
            zeros = {t.name: np.zeros((size, *t.max_shape[1:]), t.datatype.numpy) for t in inputs}
            profile = pick_profile(self.profiles, zeros)
            if profile is None:
                skipped.append(f"{path}: no optimisation profile takes batch {size}; no graph")
                continue
            try:  # whether an engine can be captured depends on its layers: degrade, not fail
                captured = self._capture(trt, profile, zeros, path)
            except BatchserveError as exc:
                skipped.append(f"{path}: no CUDA graph for batch {size}: {exc.message}")
                continue
            if any(shape[:1] != (size,) for shape in captured.outputs.values()):
                captured.graph.close()
                return [*skipped, f"{path}: CUDA graphs need every output's first axis batched"]
            self.graphs[size] = captured
        return skipped

    def _capture(
        self, trt: Any, profile: int, zeros: dict[str, np.ndarray], path: Path
    ) -> _CapturedGraph:
        context = self._context(trt, profile, path)
        self._bind(context, path)
        _set_shapes(context, zeros, path)
        _enqueue(context, self.stream, path)  # the first run after setting shapes does setup
        self.stream.synchronize()
        graph = cuda.Graph(self.stream, partial(_enqueue, context, self.stream, path))
        outputs = [t.name for t in self.tensors.values() if not t.is_input]
        shapes = {name: tuple(context.get_tensor_shape(name)) for name in outputs}
        return _CapturedGraph(graph, context, shapes)

    def run(self, inputs: Arrays, names: Sequence[str], model: str) -> dict[str, np.ndarray]:
        where = f"model '{model}'"
        held = {
            t.name: np.ascontiguousarray(inputs[t.name])
            for t in self.tensors.values()
            if t.is_input
        }
        rows = next((int(a.shape[0]) for a in held.values() if a.ndim), 1)
        graph = self._graph_for(held, rows)
        context = self._context_for(held, where) if graph is None else graph.context
        for name, array in held.items():
            staged = self.host_buffers[name].view(array.dtype, array.shape)
            np.copyto(staged, array)
            cuda.copy_to_device_async(self.device_buffers[name], staged, self.stream)
        if graph is not None:
            graph.graph.launch(self.stream)
            shapes = {n: (rows, *graph.outputs[n][1:]) for n in names}
        else:
            _set_shapes(context, held, where)
            _enqueue(context, self.stream, where)
            shapes = {name: tuple(context.get_tensor_shape(name)) for name in names}
        for name, shape in shapes.items():
            nbytes = math.prod(shape) * self.tensors[name].datatype.itemsize
            cuda.copy_to_host_async(
                self.host_buffers[name], self.device_buffers[name], nbytes, self.stream
            )
        self.stream.synchronize()
        return {
            name: self.host_buffers[name].view(self.tensors[name].datatype.numpy, shape).copy()
            for name, shape in shapes.items()
        }

    def _graph_for(self, inputs: Arrays, rows: int) -> _CapturedGraph | None:
        size = padded_batch(rows, list(self.graphs))
        if size is None:
            return None
        fits = all(
            array.shape == (rows, *self.tensors[name].max_shape[1:])
            for name, array in inputs.items()
        )
        return self.graphs[size] if fits else None

    def _context_for(self, inputs: Arrays, where: str) -> Any:
        profile = pick_profile(self.profiles, inputs)
        if profile is None:
            shapes = {name: list(array.shape) for name, array in inputs.items()}
            raise InvalidArgument(
                f"{where}: no optimisation profile of this instance accepts the shapes {shapes}"
            )
        return self.contexts[profile]

    def memory_bytes(self) -> int:
        scratch = 0 if self.scratch is None else self.scratch.nbytes
        return scratch + sum(b.nbytes for b in self.device_buffers.values())

    def close(self) -> None:
        for captured in self.graphs.values():
            captured.graph.close()
        # Contexts go before the memory they use and before their engine, the engine
        # before its runtime.
        self.graphs.clear()
        self.contexts.clear()
        for pinned in self.host_buffers.values():
            pinned.close()
        for buffer in self.device_buffers.values():
            buffer.close()
        self.host_buffers.clear()
        self.device_buffers.clear()
        if self.scratch is not None:
            self.scratch.close()
        self.stream.close()
        self.engine = self.runtime = None


def _set_shapes(context: Any, inputs: Arrays, where: Path | str) -> None:
    for name, array in inputs.items():
        if not context.set_input_shape(name, array.shape):
            raise InvalidArgument(f"{where}: TensorRT rejects shape {array.shape} of '{name}'")


def _enqueue(context: Any, stream: cuda.Stream, where: Path | str) -> None:
    if not context.execute_async_v3(stream.handle):
        raise BackendError(f"{where}: TensorRT execution failed (see its log)")


def _require_linear(trt: Any, engine: Any, names: Sequence[str], path: Path) -> None:
    """Buffers are sized and copied as dense row-major arrays: refuse vectorized I/O formats.

    Engines built with, say, ``trtexec --inputIOFormats=fp16:chw16`` pad and interleave a
    tensor's channels; copying numpy's layout into them would compute on scrambled data.
    """
    for name in names:
        layout = engine.get_tensor_format(name)
        if layout != trt.TensorFormat.LINEAR:
            raise ModelConfigError(
                f"{path}: tensor '{name}' uses TensorRT's {layout.name} format; batchserve "
                "serves engines whose inputs and outputs are LINEAR (rebuild without "
                "--inputIOFormats/--outputIOFormats, or with :chw)"
            )


def _batch_only(tensor: EngineTensor) -> bool:
    """Only the leading axis varies: a graph per batch size covers every request."""
    return tensor.min_shape[1:] == tensor.max_shape[1:] and len(tensor.min_shape) > 0


def _open_instance(
    trt: Any, runtime: Any, engine: Any, profiles: Sequence[int], path: Path
) -> _Instance:
    instance = _Instance(runtime, engine)
    try:
        instance.open(trt, profiles, path)
    except BaseException:
        instance.close()
        raise
    return instance


@contextmanager
def map_trt_errors(where: str) -> Iterator[None]:
    """The one boundary for TensorRT's exceptions (most of its failures are False or None)."""
    try:
        yield
    except BatchserveError:
        raise
    except MemoryError as exc:
        raise OutOfMemory(f"{where}: out of host memory") from exc
    except Exception as exc:
        error = OutOfMemory if "out of memory" in str(exc).lower() else BackendError
        raise error(f"{where}: {type(exc).__name__}: {exc}") from exc


class TensorRTBackend:
    """One TensorRT execution context on one GPU.

    Args:
        profile: the one optimisation profile to use; None takes the instance group's
            ``profile`` list, else every profile of the engine, and picks one per batch.
    """

    def __init__(self, *, profile: int | None = None) -> None:
        self._profile = profile
        self._instance: _Instance | None = None
        self._device = CPU
        self._name = ""
        self._signature = ModelSignature((), ())

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes this instance replays as CUDA graphs (empty without graphs)."""
        return () if self._instance is None else tuple(sorted(self._instance.graphs))

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        trt = _require_gpu(model_file, device)
        self._name = config.name or model_file.stem
        sizes = graph_batch_sizes(config, model_file)
        with map_trt_errors(str(model_file)):
            cuda.set_device(device.index)
            runtime, engine = _deserialize(trt, model_file)
            profiles: tuple[int, ...] = (self._profile,) if self._profile is not None else ()
            if not profiles:
                count = engine.num_optimization_profiles
                profiles = instance_profiles(config, device, count, model_file)
            instance = _open_instance(trt, runtime, engine, profiles, model_file)
            try:
                for warning in instance.capture_graphs(trt, sizes, model_file):
                    _log.warning(warning)
                self._signature = _engine_signature(trt, engine, model_file)
            except BaseException:
                instance.close()
                raise
        self._instance, self._device = instance, device

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        instance = self._loaded()
        tensors = list(instance.tensors.values())
        check_inputs(tensors, inputs, self._name)
        names = list(output_names or (t.name for t in tensors if not t.is_input))
        unknown = [n for n in names if n not in instance.tensors or instance.tensors[n].is_input]
        if unknown:
            raise InvalidArgument(f"model '{self._name}': unknown outputs {unknown}")
        with map_trt_errors(f"model '{self._name}'"):
            cuda.set_device(self._device.index)  # CUDA's current device is per thread
            return instance.run(inputs, names, self._name)

    def memory_bytes(self) -> int | None:
        return None if self._instance is None else self._instance.memory_bytes()

    def unload(self) -> None:
        instance, self._instance = self._instance, None
        if instance is not None:
            cuda.set_device(self._device.index)
            instance.close()

    def _loaded(self) -> _Instance:
        if self._instance is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        return self._instance
