"""Measuring what a model instance holds, and how much memory each device has.

How each figure is measured:

- CPU, held by one instance: growth of this process's resident set (``/proc/self/statm``)
  from just before the instance loads to just after each probe batch. Batches run in
  increasing size and the high-water mark is kept, because allocators (ONNX Runtime's
  arena, malloc) keep what a batch took. When ``ru_maxrss`` reaches a new peak during a
  batch, that peak counts too, so memory freed before the batch returned is not missed.
  Without /proc (macOS) the peak alone is used. Where glibc's ``mallinfo2`` exists, the
  growth of the bytes malloc has handed out counts when it is larger: once memory has
  been freed (an unloaded model), new allocations reuse resident pages and the RSS alone
  would not grow.
- GPU, held by one instance: growth of the device's used memory (NVML) over the same
  interval, or the backend's own figure (``Backend.memory_bytes()``, e.g. a TensorRT
  engine's activations and buffers) where that is larger: NVML also sees the CUDA context
  and weights, which the backend's figure leaves out.
- Total of a device: the CPU's physical memory, or the cgroup memory limit where lower (a
  container's limit on Kubernetes); a GPU's total as NVML reports it.

Both figures are process- or device-wide, so probes are serialised, and instances that
take a twin's profile load between them (``measuring_gate``): two loads measured at once
would each count the other. Traffic to models already loaded adds noise; the fit keeps its
prediction above every measurement.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

from batchserve.backends.base import Arrays, Backend
from batchserve.core.device import Device
from batchserve.core.errors import DeviceUnavailable
from batchserve.devices.host_memory import cpu_total_bytes
from batchserve.devices.placement import nvml_handle
from batchserve.models.measuring_gate import MEASURING
from batchserve.models.warmup import synthetic_batch
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.memory import MemoryProfile, MemorySample

Meter = Callable[[], int]  # bytes an instance holds now, counted from when the meter started


@contextmanager
def _nvml() -> Iterator[Any]:
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a base dependency
        raise DeviceUnavailable("nvidia-ml-py is not installed: pip install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DeviceUnavailable(
            f"NVML cannot start ({exc}): GPU memory cannot be measured without an NVIDIA "
            "driver; place the model on the CPU (instance_group KIND_CPU)"
        ) from None
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _gpu_handle(nvml: Any, index: int) -> Any:
    try:
        return nvml_handle(nvml, index)
    except nvml.NVMLError as exc:
        raise DeviceUnavailable(f"gpu:{index}: NVML does not know this GPU ({exc})") from None


def gpu_total_bytes(index: int) -> int:
    with _nvml() as nvml:
        return int(nvml.nvmlDeviceGetMemoryInfo(_gpu_handle(nvml, index)).total)


def device_total_bytes(device: Device) -> int:
    """What ``MemoryBudgets`` takes a fraction of."""
    return cpu_total_bytes() if device.kind == "cpu" else gpu_total_bytes(device.index)


def _peak_rss() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _resident() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return _peak_rss()
    return pages * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _load_mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc >= 2.33's ``mallinfo2``; None elsewhere (musl, macOS)."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    function.argtypes = []
    function.restype = _MallInfo2
    return cast(Callable[[], _MallInfo2], function)


_MALLINFO2 = _load_mallinfo2()


def _malloc_in_use() -> int:
    """Bytes malloc has handed out and not had back, on the heap and in its own mmaps."""
    if _MALLINFO2 is None:
        return 0
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


class ProcessMemory:
    """A ``Meter`` of this process: the growth of its resident set (counting any new peak) or
    of what malloc has handed out, whichever is larger. RSS misses memory that reuses pages
    freed earlier (an unloaded model's); malloc's count misses mmaps and thread stacks."""

    def __init__(self) -> None:
        self._peak = _peak_rss()
        self._resident = _resident()
        self._malloc = _malloc_in_use()

    def __call__(self) -> int:
        peak, now = _peak_rss(), _resident()
        if peak > self._peak:  # the peak was set since the last reading
            now, self._peak = max(now, peak), peak
        return max(0, now - self._resident, _malloc_in_use() - self._malloc)


@contextmanager
def gpu_meter(index: int, backend: Backend | None = None) -> Iterator[Meter]:
    """A ``Meter`` of one GPU's used memory, or the backend's own figure where larger."""
    with _nvml() as nvml:
        handle = _gpu_handle(nvml, index)

        def used() -> int:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)

        start = used()
        own = backend.memory_bytes if backend is not None else lambda: None
        yield lambda: max(0, used() - start, own() or 0)


PROBE_STEP = 64
"""Most a probe batch grows over the one before it below a quarter of the maximum."""


def probe_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, a quarter of the maximum and the maximum: enough to separate fixed from per-sample;
    with a large maximum, also every ``PROBE_STEP``-fold size between. ``probe_instance`` runs
    a size only where the sizes before it predict it fits, but the first two it runs blind:
    a ``max_batch_size`` of 2147483647 made the second a batch of 536,870,911 rows, for which
    numpy was asked for 128 GiB."""
    if max_batch_size <= 1:
        return (1,)
    quarter = max(2, max_batch_size // 4)
    sizes = {1, quarter, max_batch_size}
    step = PROBE_STEP
    while step < quarter:
        sizes.add(step)
        step *= PROBE_STEP
    return tuple(sorted(sizes))


def probe_instance(
    run: Callable[[int], object],
    measure: Meter,
    batch_sizes: Sequence[int],
    limit_bytes: int | None = None,
) -> MemoryProfile:
    """Run each batch size (ascending), keep the high-water mark of ``measure``, fit a profile.

    A size that the sizes already measured predict to exceed ``limit_bytes`` is not run:
    the probe must not itself exhaust the device it is protecting. The largest size run is
    run twice, and its sample is what the second left held, timed by the faster run: a
    runtime may allocate a shape's memory differently once it has seen it (ONNX Runtime's
    memory pattern allocates a traced plan on top of the arena the first run filled: 617
    MiB held against 341 measured after one run, for a CNN), and the budget must count
    what serving holds, not what the first run of a shape does.
    """
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"probe batch sizes {list(batch_sizes)} must be >= 1 and not empty")
    samples: list[MemorySample] = []
    high = 0
    for size in sizes:
        if _predicted_over(samples, size, limit_bytes):
            break
        run_ns = _timed(run, size)
        high = max(high, measure())
        samples.append(MemorySample(size, high, run_ns))
    largest = samples[-1]
    again_ns = _timed(run, largest.batch_size)
    high = max(high, measure())
    samples[-1] = MemorySample(largest.batch_size, high, min(largest.run_ns, again_ns))
    return MemoryProfile.fit(samples)


def _timed(run: Callable[[int], object], size: int) -> int:
    started = time.perf_counter_ns()
    run(size)
    return time.perf_counter_ns() - started


def _predicted_over(samples: Sequence[MemorySample], size: int, limit: int | None) -> bool:
    if limit is None or len(samples) < 2:
        return False
    return MemoryProfile.fit(samples).predict(size) > limit


def probe_backend(
    backend: Backend,
    model_file: Path,
    config: ModelConfig,
    device: Device,
    *,
    limit_bytes: int | None = None,
    free_dim: int = 1,
    sample: Arrays | None = None,
) -> MemoryProfile:
    """Load ``backend`` and measure it on synthetic inputs; call it on the instance's own thread.

    The result is for ``backend.device``, which is the CPU when a GPU instance fell back.
    Dynamic non-batch dims (sequence length, image size) are probed at ``free_dim``; a
    config's warm-up ``sample``, when given, is repeated instead (``warmup.synthetic_batch``).
    """
    with MEASURING.measuring(), ExitStack() as stack:
        cpu = ProcessMemory()
        gpu = _optional_gpu_meter(stack, device, backend)
        backend.load(model_file, config, device)
        declared = declared_profile(backend)
        if declared is not None:
            return declared
        meter = cpu if backend.device.kind == "cpu" else gpu
        if meter is None:
            raise DeviceUnavailable(
                f"{model_file}: {backend.device} memory cannot be measured: NVML is unavailable"
            )

        def run(batch_size: int) -> object:
            return backend.infer(synthetic_batch(config, batch_size, free_dim, sample))

        sizes = probe_batch_sizes(config.max_batch_size)
        return probe_instance(run, meter, sizes, limit_bytes)


def declared_profile(backend: Backend) -> MemoryProfile | None:
    """The memory a loaded backend says it holds, where it knows (the identity backend: the
        copies of its outputs, nothing between runs); None for the runtimes, which are measured.
        Such an instance is neither probed nor run at its cap at load: a run of it costs what it
        declares, and may only sleep (Triton's identity ``execute_delay_ms``, which would make
        its load take seconds, as Triton's takes none). A backend that also declares its run time
    (``declared_run_ns``: the identity backend's delay) starts the batcher's batch-time model
    from it; otherwise batch times are learned in service."""
    declared = getattr(backend, "declared_memory", None)
    if declared is None:
        return None
    fixed, per_sample = declared()
    run = getattr(backend, "declared_run_ns", None)
    run_ns = int(run()) if run is not None else 0
    if not run_ns:
        return MemoryProfile(fixed, per_sample)
    # Its batch time too, where it sleeps: any size takes as long (the batcher starts there).
    timed = tuple(MemorySample(size, fixed + per_sample * size, run_ns) for size in (1, 2))
    return MemoryProfile(fixed, per_sample, timed)


def _optional_gpu_meter(stack: ExitStack, device: Device, backend: Backend) -> Meter | None:
    """The GPU's meter, or None without NVML: the backend decides then (fall back or refuse)."""
    if device.kind != "gpu":
        return None
    try:
        return stack.enter_context(gpu_meter(device.index, backend))
    except DeviceUnavailable:
        return None
