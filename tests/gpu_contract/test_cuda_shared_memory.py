"""CUDA shared memory over the stub driver: the real cuda-python calls the region manager
makes, on a machine whose driver sees no GPU, end in Triton's refusal plus the reason."""

from __future__ import annotations

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.dataplane.shared_memory.manager import SharedMemoryManager


def test_registering_cuda_shared_memory_without_a_device_is_refused_clearly() -> None:
    regions = SharedMemoryManager()
    with pytest.raises(InvalidArgument) as refused:
        regions.register_cuda("gpu", bytes(64), 0, 256)
    assert refused.value.message.startswith(
        "failed to register CUDA shared memory region: 'gpu', GPUs not supported; "
        "CUDA shared memory needs a GPU: cudaGetDeviceCount failed: cudaErrorNoDevice"
    )
    assert regions.status("cuda") == []
    regions.unregister("cuda")  # nothing registered: nothing to close, no error
