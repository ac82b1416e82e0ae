"""A serialised TensorRT engine: what loading one needs, and what it declares.

TensorRT, cuda-python and a usable GPU are checked together, so one message says all that is
missing. ``tensorrt`` is imported inside functions: a server without it still starts, and
serves ONNX and PyTorch models.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchserve.backends.tensorrt_profiles import EngineTensor, datatype_from_trt
from batchserve.core.device import Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.devices import cuda
from batchserve.devices.placement import gpu_count


def _import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError:
        return None
    return tensorrt


def require_gpu(path: Path, device: Device | None) -> Any:
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


def deserialize(trt: Any, path: Path) -> tuple[Any, Any]:
    """The runtime and the engine it deserialised from ``path`` (the engine needs both)."""
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


def io_names(trt: Any, engine: Any) -> tuple[list[str], list[str]]:
    """The engine's input names and output names, in its own order."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    return inputs, [n for n in names if n not in inputs]


def _engine_spec(engine: Any, name: str, path: Path) -> TensorSpec:
    shape = tuple(d if d >= 0 else DYNAMIC for d in engine.get_tensor_shape(name))
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return TensorSpec(name, datatype, shape, (None,) * len(shape))


def engine_signature(trt: Any, engine: Any, path: Path) -> ModelSignature:
    """The engine's inputs and outputs as a ModelSignature (dynamic dims are DYNAMIC)."""
    inputs, outputs = io_names(trt, engine)
    return ModelSignature(
        tuple(_engine_spec(engine, n, path) for n in inputs),
        tuple(_engine_spec(engine, n, path) for n in outputs),
    )


def read_engine_signature(path: Path) -> ModelSignature:
    """Inputs and outputs of a serialised engine (dynamic dims are DYNAMIC); needs a GPU."""
    trt = require_gpu(path, None)
    _, engine = deserialize(trt, path)
    return engine_signature(trt, engine, path)


def profile_input(engine: Any, name: str, profile: int, path: Path) -> tuple[EngineTensor, int]:
    """The input's range under ``profile``, and the batch size the profile was tuned for."""
    if engine.is_shape_inference_io(name):
        raise ModelConfigError(f"{path}: input '{name}' is a shape tensor, which is unsupported")
    shape = tuple(engine.get_tensor_shape(name))
    low = opt = high = shape
    if DYNAMIC in shape:
        low, opt, high = (tuple(s) for s in engine.get_tensor_profile_shape(name, profile))
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, True, low, high), (opt[0] if opt else 1)


def output_tensor(engine: Any, context: Any, name: str, path: Path) -> EngineTensor:
    """The output's shape under a context whose inputs are set; data-dependent is refused."""
    shape = tuple(context.get_tensor_shape(name))  # after every input was set to its maximum
    if any(d < 0 for d in shape):
        raise ModelConfigError(f"{path}: output '{name}' has a data-dependent shape, unsupported")
    datatype = datatype_from_trt(engine.get_tensor_dtype(name).name, name, path)
    return EngineTensor(name, datatype, False, shape, shape)


def scratch_bytes(engine: Any) -> int:
    """The scratch memory the engine's execution contexts need."""
    size = getattr(engine, "device_memory_size_v2", None)  # TensorRT >= 10.1
    return int(engine.device_memory_size if size is None else size)


def require_linear(trt: Any, engine: Any, names: Sequence[str], path: Path) -> None:
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
