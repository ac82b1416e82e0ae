"""TensorRT backend: a deserialised engine with one execution context and CUDA stream per instance.

Buffers are sized for the optimisation profile's largest shapes once at load, so a batch
never allocates: inputs are copied to the device on the instance's own stream, outputs come
back through pinned host buffers reused across batches. ``tensorrt`` and cuda-python are
imported inside functions; without them, or without a GPU, load says which is missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.backends import cuda
from batchserve.backends.base import Arrays
from batchserve.datatypes import BY_WIRE, DataType
from batchserve.devices import CPU, Device, gpu_count
from batchserve.errors import (
    BackendError,
    BatchserveError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.grpc.generated.model_config_pb2 import ModelConfig, ModelInstanceGroup
from batchserve.signature import DYNAMIC, ModelSignature, TensorSpec

_TRT_TO_WIRE = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}
_GPU_KINDS = (ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_AUTO)


def datatype_from_trt(trt_name: str, tensor: str, path: Path) -> DataType:
    """The protocol datatype of a ``tensorrt.DataType`` member name (FP8, INT4... have none)."""
    wire = _TRT_TO_WIRE.get(trt_name)
    if wire is None:
        raise ModelConfigError(
            f"{path}: tensor '{tensor}' has TensorRT type {trt_name}, unsupported"
        )
    return BY_WIRE[wire]


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One I/O tensor of an engine under the instance's optimisation profile.

    Args:
        name: tensor name in the engine.
        datatype: element type.
        is_input: True for inputs.
        min_shape: smallest shape the profile accepts (outputs: same as ``max_shape``).
        max_shape: largest shape; buffers are sized for it.
    """

    name: str
    datatype: DataType
    is_input: bool
    min_shape: tuple[int, ...]
    max_shape: tuple[int, ...]

    @property
    def max_bytes(self) -> int:
        return math.prod(self.max_shape) * self.datatype.itemsize


def check_inputs(tensors: Sequence[EngineTensor], inputs: Arrays, model: str) -> None:
    """Raise InvalidArgument, naming the tensor, unless ``inputs`` fit the engine's profile."""
    expected = {t.name: t for t in tensors if t.is_input}
    unknown, missing = sorted(set(inputs) - set(expected)), sorted(set(expected) - set(inputs))
    if unknown or missing:
        raise InvalidArgument(
            f"model '{model}': the engine takes inputs {sorted(expected)}; "
            f"unknown {unknown}, missing {missing}"
        )
    for tensor in expected.values():
        _check_input(tensor, inputs[tensor.name], model)


def _check_input(tensor: EngineTensor, array: np.ndarray, model: str) -> None:
    if array.dtype != tensor.datatype.numpy:
        raise InvalidArgument(
            f"model '{model}': input '{tensor.name}' has numpy dtype {array.dtype}, "
            f"but the engine expects {tensor.datatype.wire}"
        )
    bounds = zip(array.shape, tensor.min_shape, tensor.max_shape, strict=False)
    if len(array.shape) != len(tensor.min_shape) or any(
        not lo <= dim <= hi for dim, lo, hi in bounds
    ):
        raise InvalidArgument(
            f"model '{model}': input '{tensor.name}' has shape {list(array.shape)}; the engine's "
            f"optimisation profile accepts {list(tensor.min_shape)} to {list(tensor.max_shape)}"
        )


def choose_profile(config: ModelConfig, device: Device, profiles: int, path: Path) -> int:
    """The optimisation profile of the first GPU instance group covering ``device``, else 0."""
    for group in config.instance_group:
        covers = not group.gpus or device.index in group.gpus
        if group.kind in _GPU_KINDS and covers and group.profile:
            value = group.profile[0]
            if not value.isdigit() or int(value) >= profiles:
                raise ModelConfigError(
                    f"{path}: instance_group profile {value!r} is not one of the engine's "
                    f"{profiles} optimisation profiles (0..{profiles - 1})"
                )
            return int(value)
    return 0


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
        problems.append("cuda-python (>= 12.6) is not installed")
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


def _input_tensor(engine: Any, name: str, profile: int, path: Path) -> EngineTensor:
    if engine.is_shape_inference_io(name):
        raise ModelConfigError(f"{path}: input '{name}' is a shape tensor, which is unsupported")
    shape = tuple(engine.get_tensor_shape(name))
    low, high = shape, shape
    if DYNAMIC in shape:
        low, _, high = (tuple(s) for s in engine.get_tensor_profile_shape(name, profile))
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, True, low, high)


def _output_tensor(engine: Any, context: Any, name: str, path: Path) -> EngineTensor:
    shape = tuple(context.get_tensor_shape(name))  # after every input was set to its maximum
    if any(d < 0 for d in shape):
        raise ModelConfigError(f"{path}: output '{name}' has a data-dependent shape, unsupported")
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, False, shape, shape)


class _Instance:
    """What one loaded instance owns on the GPU; ``close`` frees it all and may run twice."""

    def __init__(self, runtime: Any, engine: Any) -> None:
        self.runtime, self.engine = runtime, engine
        self.context: Any = None
        self.stream = cuda.Stream()
        self.tensors: dict[str, EngineTensor] = {}
        self.device_buffers: dict[str, cuda.DeviceBuffer] = {}
        self.host_buffers: dict[str, cuda.PinnedBuffer] = {}

    def open(self, trt: Any, profile: int, path: Path) -> None:
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise OutOfMemory(f"{path}: TensorRT could not create an execution context")
        if not self.context.set_optimization_profile_async(profile, self.stream.handle):
            raise ModelConfigError(f"{path}: cannot select optimisation profile {profile}")
        self._describe(trt, profile, path)
        for tensor in self.tensors.values():
            self.device_buffers[tensor.name] = cuda.DeviceBuffer(tensor.max_bytes)
            if not tensor.is_input:
                self.host_buffers[tensor.name] = cuda.PinnedBuffer(tensor.max_bytes)
            if not self.context.set_tensor_address(
                tensor.name, self.device_buffers[tensor.name].pointer
            ):
                raise BackendError(f"{path}: TensorRT refused the buffer of '{tensor.name}'")

    def _describe(self, trt: Any, profile: int, path: Path) -> None:
        input_names, output_names = _io_names(trt, self.engine)
        for name in input_names:
            tensor = _input_tensor(self.engine, name, profile, path)
            self.tensors[name] = tensor
            if not self.context.set_input_shape(name, tensor.max_shape):
                raise ModelConfigError(f"{path}: TensorRT rejects the profile's maximum shape")
        for name in output_names:
            self.tensors[name] = _output_tensor(self.engine, self.context, name, path)

    def run(self, inputs: Arrays, names: Sequence[str], model: str) -> dict[str, np.ndarray]:
        held = {
            t.name: np.ascontiguousarray(inputs[t.name])
            for t in self.tensors.values()
            if t.is_input
        }
        for name, array in held.items():
            if not self.context.set_input_shape(name, array.shape):
                raise InvalidArgument(f"model '{model}': TensorRT rejects shape {array.shape}")
            cuda.copy_to_device_async(self.device_buffers[name], array, self.stream)
        if not self.context.execute_async_v3(self.stream.handle):
            raise BackendError(f"model '{model}': TensorRT execution failed (see its log)")
        shapes = {name: tuple(self.context.get_tensor_shape(name)) for name in names}
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

    def memory_bytes(self) -> int:
        engine_bytes = getattr(self.engine, "device_memory_size_v2", None)
        if engine_bytes is None:
            engine_bytes = self.engine.device_memory_size
        return int(engine_bytes) + sum(b.nbytes for b in self.device_buffers.values())

    def close(self) -> None:
        self.context = None  # the context goes before its engine, the engine before its runtime
        for pinned in self.host_buffers.values():
            pinned.close()
        for buffer in self.device_buffers.values():
            buffer.close()
        self.host_buffers.clear()
        self.device_buffers.clear()
        self.stream.close()
        self.engine = self.runtime = None


def _open_instance(trt: Any, runtime: Any, engine: Any, profile: int, path: Path) -> _Instance:
    instance = _Instance(runtime, engine)
    try:
        instance.open(trt, profile, path)
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
        profile: optimisation profile to use; None takes it from the instance group (else 0).
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

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        trt = _require_gpu(model_file, device)
        self._name = config.name or model_file.stem
        with map_trt_errors(str(model_file)):
            cuda.set_device(device.index)
            runtime, engine = _deserialize(trt, model_file)
            profile = self._profile
            if profile is None:
                profiles = engine.num_optimization_profiles
                profile = choose_profile(config, device, profiles, model_file)
            instance = _open_instance(trt, runtime, engine, profile, model_file)
            self._signature = _engine_signature(trt, engine, model_file)
        self._instance, self._device = instance, device

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        instance = self._loaded()
        tensors = list(instance.tensors.values())
        check_inputs(tensors, inputs, self._name)
        names = list(output_names or (t.name for t in tensors if not t.is_input))
        unknown = [n for n in names if n not in instance.host_buffers]
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
