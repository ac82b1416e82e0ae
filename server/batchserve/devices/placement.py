"""Devices a model instance can run on, and what the machine really has."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

_log = logging.getLogger(__name__)


def gpu_count() -> int:
    """GPUs this process can run on, numbered as CUDA numbers them; 0 without driver or GPU.

    CUDA decides, not NVML: NVML lists every board in the machine whatever
    CUDA_VISIBLE_DEVICES says, in an order that need not be CUDA's, and lists a MIG slice as
    its whole GPU. Without cuda-python (the ``gpu`` extra) NVML's count is the only one there
    is, and CUDA_VISIBLE_DEVICES is then not honoured.
    """
    if not driver_present():
        return 0
    cudart = _cuda_runtime()
    if cudart is None:
        return _nvml_count()
    error, count = cudart.cudaGetDeviceCount()
    return int(count) if error == cudart.cudaError_t.cudaSuccess else 0


DRIVER_LIBRARY = "libcuda.so.1"
"""NVIDIA's driver API, which the CUDA runtime loads to find any device."""


def driver_present() -> bool:
    """Whether NVIDIA's driver library loads: without it CUDA has no device to find. Asked
    first because cuda-python's import and its search for the runtime took 70-90 ms of every
    server start on a CPU-only host, to answer 0; the library's absence takes 0.1-0.2 ms."""
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return False
    return True


def nvml_handle(nvml: Any, index: int) -> Any:
    """NVML's handle for CUDA device ``index`` (``nvml`` is the initialised pynvml module).

    Matched by UUID, which CUDA and NVML share (a MIG slice's under the ``MIG-`` prefix), so
    memory and metrics are read from the device or slice an instance really runs on.
    Without cuda-python, NVML's index is taken for CUDA's.
    """
    uuid = cuda_uuid(index)
    if uuid is None:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    except nvml.NVMLError_NotFound:
        return nvml.nvmlDeviceGetHandleByUUID(f"MIG-{uuid.removeprefix('GPU-')}")


def cuda_uuid(index: int) -> str | None:
    """CUDA device ``index``'s UUID as NVML writes it (``GPU-8hex-4hex-4hex-4hex-12hex``).

    None without cuda-python; DeviceUnavailable when CUDA has no such device.
    """
    cudart = _cuda_runtime()
    if cudart is None:
        return None
    error, properties = cudart.cudaGetDeviceProperties(index)
    if error != cudart.cudaError_t.cudaSuccess:
        raise DeviceUnavailable(f"gpu:{index}: CUDA cannot read this device ({error.name})")
    return nvml_uuid(bytes(properties.uuid.bytes))


def nvml_uuid(raw: bytes) -> str:
    """CUDA's 16 UUID bytes written as NVML writes a GPU's UUID."""
    parts = (raw[:4], raw[4:6], raw[6:8], raw[8:10], raw[10:16])
    return "GPU-" + "-".join(part.hex() for part in parts)


def _cuda_runtime() -> Any:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    return runtime


def _nvml_count() -> int:
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a base dependency
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def group_name(config: ModelConfig, group: ModelInstanceGroup, position: int) -> str:
    """An instance group's name as Triton names it: its own, else ``<model>_<position>``."""
    return group.name or f"{config.name}_{position}"


def unsupported_gpu(
    config: ModelConfig, group: ModelInstanceGroup, position: int, index: int, present: str
) -> str:
    """Triton's words for an instance group naming GPU ``index``, which this process cannot
    use (Triton's ``ValidateInstanceGroup``; its ``L0_model_config`` reads them), ``present``
    naming the GPUs it can. batchserve sets no minimum compute capability: it uses every GPU
    CUDA sees."""
    return (
        f"instance group {group_name(config, group, position)} of model {config.name} specifies "
        f"invalid or unsupported gpu id {index}. GPUs with at least the minimum required CUDA "
        f"compute compatibility (batchserve sets none) are: {present}"
    )


def gpus_present(available_gpus: int) -> str:
    """The GPUs this process can use, as ``unsupported_gpu`` lists them."""
    return ", ".join(str(gpu) for gpu in range(available_gpus)) or "none"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where ``instance_group`` puts one instance, as Triton's instance signature: its device
    and its group's settings but name and count. Instances of equal placement are
    interchangeable, so a change of count keeps those loaded."""

    device: Device
    group: bytes

    @property
    def passive(self) -> bool:
        """Triton's ``passive: true``: loaded, and given no requests."""
        return ModelInstanceGroup.FromString(self.group).passive


def resolve_devices(
    config: ModelConfig, available_gpus: int, *, auto_gpu: bool = True
) -> list[Device]:
    """One Device per model instance, placed from ``instance_group`` as Triton places them.

    No instance_group means one instance per GPU present, or one on the CPU without GPUs.
    ``auto_gpu`` False (the model's runtime cannot use a GPU in this process: onnxruntime
    without its CUDA provider, a CPU-only torch) places ``KIND_AUTO`` groups on the CPU, as
    Triton does for a backend that prefers the CPU; ``KIND_GPU`` still asks for a GPU.
    """
    placements = resolve_placements(config, available_gpus, auto_gpu=auto_gpu)
    return [placement.device for placement in placements]


def resolve_placements(
    config: ModelConfig, available_gpus: int, *, auto_gpu: bool = True
) -> list[Placement]:
    """``resolve_devices``, with each instance's group signature."""
    groups = list(config.instance_group) or [ModelInstanceGroup(kind=ModelInstanceGroup.KIND_AUTO)]
    placements: list[Placement] = []
    for position, group in enumerate(groups):
        key = group_signature(group)
        devices = _group_devices(config, group, position, available_gpus, auto_gpu)
        placements.extend(Placement(device, key) for device in devices)
    return placements


def group_signature(group: ModelInstanceGroup) -> bytes:
    """A group's settings but name and count: ``Placement.group``."""
    signature = ModelInstanceGroup()
    signature.CopyFrom(group)
    signature.ClearField("name")
    signature.ClearField("count")
    return signature.SerializeToString(deterministic=True)


def places_auto(config: ModelConfig) -> bool:
    """Whether the server chooses the device of some of ``config``'s instances (KIND_AUTO,
    named or implied by no instance_group at all)."""
    groups = list(config.instance_group)
    return not groups or any(g.kind == ModelInstanceGroup.KIND_AUTO for g in groups)


def _group_devices(
    config: ModelConfig,
    group: ModelInstanceGroup,
    position: int,
    available_gpus: int,
    auto_gpu: bool,
) -> list[Device]:
    label = f"model '{config.name}' instance_group '{group.name or position}'"
    if group.count < 0:
        raise ModelConfigError(f"{label}: count {group.count} is negative")
    count = group.count or 1
    negative = next((index for index in group.gpus if index < 0), None)
    if negative is not None:
        triton = unsupported_gpu(config, group, position, negative, gpus_present(available_gpus))
        raise ModelConfigError(
            f"{triton} (batchserve: {label}: gpus {list(group.gpus)} lists a negative index)"
        )
    kind = group.kind
    if kind == ModelInstanceGroup.KIND_AUTO:
        unusable = not auto_gpu or available_gpus == 0
        if unusable or any(index >= available_gpus for index in group.gpus):
            return [CPU] * count
        kind = ModelInstanceGroup.KIND_GPU
    if kind == ModelInstanceGroup.KIND_GPU:
        return _gpu_devices(config, group, position, label, count, available_gpus)
    if kind == ModelInstanceGroup.KIND_CPU and not group.gpus:
        return [CPU] * count
    if kind == ModelInstanceGroup.KIND_CPU:
        raise ModelConfigError(f"{label}: kind KIND_CPU cannot list gpus {list(group.gpus)}")
    raise ModelConfigError(f"{label}: kind KIND_MODEL is not supported; use KIND_GPU or KIND_CPU")


def _gpu_devices(
    config: ModelConfig,
    group: ModelInstanceGroup,
    position: int,
    label: str,
    count: int,
    available_gpus: int,
) -> list[Device]:
    indices = list(group.gpus) or list(range(available_gpus))
    missing = [index for index in indices if index >= available_gpus]
    if indices and not missing:
        return [Device("gpu", index) for index in indices for _ in range(count)]
    wanted = f"GPUs {missing}" if missing else "a GPU"
    problem = f"{label} asks for {wanted}, but this machine has {available_gpus} GPU(s)"
    if config.batchserve.allow_cpu_fallback:
        _log.warning("%s; running its instances on the CPU (allow_cpu_fallback)", problem)
        return [CPU] * (count * max(1, len(indices)))
    name = group_name(config, group, position)
    triton = (  # Triton's words first, as its ValidateInstanceGroup says it
        unsupported_gpu(config, group, position, missing[0], gpus_present(available_gpus))
        if missing
        else f"instance group {name} of model {config.name} has kind KIND_GPU but no GPUs "
        "are available"
    )
    raise DeviceUnavailable(
        f"{triton} (batchserve: {problem}. Install an NVIDIA driver and expose the GPUs to "
        "this process, list only GPUs that exist, or set `batchserve { allow_cpu_fallback: "
        "true }` to run on the CPU)"
    )
