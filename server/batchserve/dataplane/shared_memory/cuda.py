"""A client's CUDA memory opened from its ``cudaIpcMemHandle_t`` (cuda-python's
``cuda.bindings.runtime``, through ``backends/cuda.py``'s ``call``).

Inputs are copied device to host at once (the models take host arrays); outputs are copied
host to device. The client states the region's size; registration checks it against the
allocation the handle opens (``cuMemGetAddressRange``), as Triton does, so no copy can run
past the client's allocation. Copies are synchronous ``cudaMemcpy`` calls.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np

from batchserve.core.errors import BatchserveError, DeviceUnavailable, InvalidArgument
from batchserve.devices.cuda import call, runtime, set_device

HANDLE_SIZE: Final = 64  # sizeof(cudaIpcMemHandle_t)


def _no_gpu(name: str, reason: str) -> InvalidArgument:
    return InvalidArgument(
        f"failed to register CUDA shared memory region: '{name}', GPUs not supported; "
        f"CUDA shared memory needs a GPU: {reason}"
    )


def _ipc_handle(raw: bytes) -> Any:
    """cuda-bindings >= 13 has no ``reserved`` field: the 64 bytes go in through getPtr()."""
    handle_type = runtime().cudaIpcMemHandle_t  # a C type: no signature to introspect
    handle = handle_type()
    ctypes.memmove(handle.getPtr(), raw, HANDLE_SIZE)
    return handle


def _allocation_size(pointer: int) -> int:
    """Bytes of the allocation ``pointer`` starts in, from the address onwards."""
    from cuda.bindings import driver

    error, base, size = driver.cuMemGetAddressRange(pointer)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise InvalidArgument(f"cuMemGetAddressRange failed: {error.name}")
    return int(base) + int(size) - pointer


def _device_runtime(name: str, device_id: int) -> Any:
    """cuda-python's runtime with ``device_id`` current; refused clearly without a GPU."""
    try:
        cudart = runtime()
        count = int(call("cudaGetDeviceCount"))
    except DeviceUnavailable as error:
        raise _no_gpu(name, error.message) from None
    if count == 0:
        raise _no_gpu(name, "CUDA sees no device")
    if not 0 <= device_id < count:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': invalid args (device_id "
            f"{device_id} is not one of the {count} CUDA devices 0..{count - 1})"
        )
    set_device(device_id)
    return cudart


class CudaRegion:
    """``byte_size`` bytes of device ``device_id`` memory another process exported."""

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != HANDLE_SIZE:
            raise InvalidArgument(
                "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t "
                f"({HANDLE_SIZE} bytes, got {len(raw_handle)})"
            )
        cudart = _device_runtime(name, device_id)
        flags = cudart.cudaIpcMemLazyEnablePeerAccess
        try:
            pointer = int(call("cudaIpcOpenMemHandle", _ipc_handle(raw_handle), flags))
        except BatchserveError as error:
            raise InvalidArgument(
                f"failed to register shared memory region: invalid args ({error.message})"
            ) from None
        try:
            available = _allocation_size(pointer)
            if byte_size > available:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': invalid args "
                    f"(byte_size {byte_size} is larger than the {available}-byte allocation)"
                )
        except BaseException:
            call("cudaIpcCloseMemHandle", pointer)
            raise
        self.name, self.device_id, self.byte_size = name, device_id, byte_size
        self._pointer = pointer

    def read(self, offset: int, size: int, tensor: str) -> bytes:
        """A host copy of ``size`` bytes at ``offset`` (bounds checked by the caller)."""
        out = np.empty(size, np.uint8)
        set_device(self.device_id)
        kind = runtime().cudaMemcpyKind.cudaMemcpyDeviceToHost
        call("cudaMemcpy", out.ctypes.data, self._pointer + offset, size, kind)
        return out.tobytes()

    def write(self, offset: int, data: bytes | memoryview, tensor: str) -> None:
        source = np.frombuffer(data, np.uint8)
        set_device(self.device_id)
        kind = runtime().cudaMemcpyKind.cudaMemcpyHostToDevice
        call("cudaMemcpy", self._pointer + offset, source.ctypes.data, source.nbytes, kind)

    def close(self) -> None:
        if self._pointer:
            pointer, self._pointer = self._pointer, 0
            set_device(self.device_id)
            call("cudaIpcCloseMemHandle", pointer)
