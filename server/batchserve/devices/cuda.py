"""The few CUDA runtime calls the GPU backends make, with errors turned into batchserve's.

cuda-python returns ``(error, *values)`` tuples instead of raising; ``call`` checks each one
so an allocation failure is ``OutOfMemory`` and a missing driver is ``DeviceUnavailable``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from batchserve.core.errors import BackendError, BatchserveError, DeviceUnavailable, OutOfMemory

_NO_DEVICE = (
    "cudaErrorNoDevice",
    "cudaErrorInsufficientDriver",
    "cudaErrorInvalidDevice",
    "cudaErrorDevicesUnavailable",
    "cudaErrorCallRequiresNewerDriver",
    "cudaErrorSystemDriverMismatch",
)


def runtime() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``, cuda-python >= 12.6.2)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        raise DeviceUnavailable(
            "cuda-python is not installed (or older than 12.6.2, which has no "
            "cuda.bindings.runtime): pip install 'batchserve[gpu]'"
        ) from None
    return cudart


def translate_error(error: Any, function: str) -> BatchserveError:
    """The batchserve error for a failed CUDA runtime call."""
    cudart = runtime()
    name = error.name if hasattr(error, "name") else str(error)
    _, text = cudart.cudaGetErrorString(error)
    message = f"{function} failed: {name}: {text.decode(errors='replace')}"
    if name == "cudaErrorMemoryAllocation":
        return OutOfMemory(message)
    if name in _NO_DEVICE:
        return DeviceUnavailable(message)
    return BackendError(message)


def call(function: str, *args: Any) -> Any:
    """Call ``cudart.<function>(*args)``; return its single value (or None), raise on error."""
    cudart = runtime()
    error, *values = getattr(cudart, function)(*args)
    if error != cudart.cudaError_t.cudaSuccess:
        raise translate_error(error, function)
    return values[0] if values else None


def set_device(index: int) -> None:
    """Make ``index`` current for this thread (CUDA's current device is per thread)."""
    call("cudaSetDevice", index)


class Stream:
    """A non-blocking CUDA stream: one per model instance, so instances overlap.

    ``synchronize`` waits on an event that blocks the thread (``cudaEventBlockingSync``),
    as Triton does unless a model's ``optimization.cuda.busy_wait_events`` is true
    (``busy_wait``): ``cudaStreamSynchronize`` under CUDA's default scheduling spins
    whenever the process has fewer contexts than the host has cores, so an instance waiting
    for its GPU would hold a core busy the whole time, a core request handling needs.
    """

    def __init__(self, busy_wait: bool = False) -> None:
        cudart = runtime()
        self._handle: Any = call("cudaStreamCreateWithFlags", cudart.cudaStreamNonBlocking)
        self._done: Any = None
        if not busy_wait:
            flags = cudart.cudaEventBlockingSync | cudart.cudaEventDisableTiming
            try:
                self._done = call("cudaEventCreateWithFlags", flags)
            except BatchserveError:
                self.close()
                raise

    @property
    def handle(self) -> int:
        """The raw ``cudaStream_t`` as TensorRT's ``execute_async_v3`` takes it."""
        return int(self._handle)

    def synchronize(self) -> None:
        """Return once the work queued so far on this stream is done."""
        if self._done is None:
            call("cudaStreamSynchronize", self._handle)
            return
        call("cudaEventRecord", self._done, self._handle)
        call("cudaEventSynchronize", self._done)

    def close(self) -> None:
        if self._done is not None:
            done, self._done = self._done, None
            call("cudaEventDestroy", done)
        if self._handle is not None:
            handle, self._handle = self._handle, None
            call("cudaStreamDestroy", handle)


class DeviceBuffer:
    """``nbytes`` of device memory (``cudaMalloc``)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer: int = int(call("cudaMalloc", max(nbytes, 1)))

    def close(self) -> None:
        if self.pointer:
            pointer, self.pointer = self.pointer, 0
            call("cudaFree", pointer)


class PinnedBuffer:
    """``nbytes`` of page-locked host memory (``cudaMallocHost``): async copies need it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer: int = int(call("cudaMallocHost", max(nbytes, 1)))

    def view(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """A numpy array over the start of the buffer (valid until the next copy into it)."""
        count = int(np.prod(shape, dtype=np.int64))
        raw = (ctypes.c_char * max(self.nbytes, 1)).from_address(self.pointer)
        return np.frombuffer(memoryview(raw), dtype=dtype, count=count).reshape(shape)

    def close(self) -> None:
        if self.pointer:
            pointer, self.pointer = self.pointer, 0
            call("cudaFreeHost", pointer)


def copy_to_device_async(target: DeviceBuffer, array: np.ndarray, stream: Stream) -> None:
    """Queue a host-to-device copy of a C-contiguous array; it must fit ``target``."""
    if array.nbytes > target.nbytes:
        raise BackendError(f"{array.nbytes} bytes do not fit a {target.nbytes}-byte buffer")
    kind = runtime().cudaMemcpyKind.cudaMemcpyHostToDevice
    call("cudaMemcpyAsync", target.pointer, array.ctypes.data, array.nbytes, kind, stream.handle)


def copy_to_host_async(
    target: PinnedBuffer, source: DeviceBuffer, nbytes: int, stream: Stream
) -> None:
    """Queue a device-to-host copy of the first ``nbytes`` of ``source``."""
    if nbytes > min(target.nbytes, source.nbytes):
        raise BackendError(f"{nbytes} bytes do not fit a {target.nbytes}-byte buffer")
    kind = runtime().cudaMemcpyKind.cudaMemcpyDeviceToHost
    call("cudaMemcpyAsync", target.pointer, source.pointer, nbytes, kind, stream.handle)


def memset_async(target: DeviceBuffer, value: int, stream: Stream) -> None:
    """Queue filling ``target`` with the byte ``value``."""
    call("cudaMemsetAsync", target.pointer, value, target.nbytes, stream.handle)


class Graph:
    """A CUDA graph captured from the work one call queues on a stream, ready to replay.

    Replaying launches every kernel of the capture with one call, and with the same
    arguments: the same device addresses and shapes, so the buffers it used must stay put.
    """

    def __init__(self, stream: Stream, work: Callable[[], None]) -> None:
        cudart = runtime()
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        call("cudaStreamBeginCapture", stream.handle, mode)
        try:
            work()
        except BaseException:
            _, leftover = cudart.cudaStreamEndCapture(stream.handle)  # its error is moot
            if leftover is not None and int(leftover):
                cudart.cudaGraphDestroy(leftover)
            raise
        graph = call("cudaStreamEndCapture", stream.handle)
        try:
            self._exec: Any = call("cudaGraphInstantiate", graph, 0)
        finally:
            call("cudaGraphDestroy", graph)

    def launch(self, stream: Stream) -> None:
        call("cudaGraphLaunch", self._exec, stream.handle)

    def close(self) -> None:
        if self._exec is not None:
            graph_exec, self._exec = self._exec, None
            call("cudaGraphExecDestroy", graph_exec)
