"""CUDA shared memory for real: this process exports device memory as a client does
(``cudaMalloc`` + ``cudaIpcGetMemHandle``), a second process registers it with the region
manager, reads the input and writes an output; this process then reads the output back.
CUDA IPC handles cannot be opened by the process that made them, hence the two.
Runs on GPU machines (``make gpu-check``); skipped elsewhere."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from batchserve.devices.cuda import call, runtime
from batchserve.devices.placement import gpu_count

needs_gpu = pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU")

SERVER_SIDE = textwrap.dedent(
    """
    import sys
    from batchserve.core.errors import InvalidArgument
    from batchserve.dataplane.shared_memory.manager import SharedMemoryManager

    handle = bytes.fromhex(sys.argv[1])
    regions = SharedMemoryManager()
    try:
        regions.register_cuda("gpu", handle, 0, 1 << 30)  # larger than the allocation
    except InvalidArgument as error:
        print("refused:", error.message)
    regions.register_cuda("gpu", handle, 0, 256)
    region = regions.region("gpu", 0, 64)
    print("read:", region.read(0, 64, "x").hex())
    regions.region("gpu", 128, 64).write(128, bytes(range(100, 164)), "y")
    regions.unregister("cuda")
    print("status:", regions.status("cuda"))
    """
)


@pytest.mark.gpu
@needs_gpu
def test_a_region_exported_by_another_process_is_read_and_written() -> None:
    cudart = runtime()
    call("cudaSetDevice", 0)
    pointer = int(call("cudaMalloc", 256))
    try:
        data = np.arange(64, dtype=np.uint8)
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        call("cudaMemcpy", pointer, data.ctypes.data, 64, to_device)
        handle = call("cudaIpcGetMemHandle", pointer)
        raw = ctypes.string_at(handle.getPtr(), 64)

        child = subprocess.run(
            [sys.executable, "-c", SERVER_SIDE, raw.hex()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0, child.stderr
        lines = child.stdout.splitlines()
        assert lines[0].startswith("refused: failed to register shared memory region 'gpu'")
        assert "larger than the" in lines[0]
        assert lines[1] == "read: " + bytes(range(64)).hex()
        assert lines[2] == "status: []"

        out = np.zeros(64, dtype=np.uint8)
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        call("cudaMemcpy", out.ctypes.data, pointer + 128, 64, to_host)
        np.testing.assert_array_equal(out, np.arange(100, 164, dtype=np.uint8))
    finally:
        call("cudaFree", pointer)
