import numpy as np
import pytest
from batchserve.core.errors import BackendError, DeviceUnavailable, OutOfMemory
from batchserve.devices import cuda
from batchserve.devices.placement import cuda_uuid, gpu_count, nvml_uuid

HAS_GPU = gpu_count() > 0


@pytest.mark.parametrize(
    ("name", "expected", "text"),
    [
        ("cudaErrorMemoryAllocation", OutOfMemory, "out of memory"),
        ("cudaErrorInsufficientDriver", DeviceUnavailable, "driver version is insufficient"),
        ("cudaErrorNoDevice", DeviceUnavailable, "no CUDA-capable device"),
        ("cudaErrorIllegalAddress", BackendError, "illegal memory access"),
    ],
)
def test_cuda_errors_map_to_batchserve_errors(name: str, expected: type, text: str):
    error = getattr(cuda.runtime().cudaError_t, name)
    translated = cuda.translate_error(error, "cudaMalloc")
    assert type(translated) is expected
    assert translated.message.startswith(f"cudaMalloc failed: {name}: ")
    assert text in translated.message


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_without_a_driver_there_are_no_devices_and_no_allocations():
    assert gpu_count() == 0
    with pytest.raises(DeviceUnavailable, match=r"gpu:0: CUDA cannot read this device"):
        cuda_uuid(0)
    with pytest.raises(DeviceUnavailable, match="cudaMalloc failed"):
        cuda.DeviceBuffer(16)
    with pytest.raises(DeviceUnavailable, match="cudaStreamCreateWithFlags failed"):
        cuda.Stream()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_round_trip_through_the_device_on_a_stream():
    cuda.set_device(0)
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    stream, device, pinned = cuda.Stream(), cuda.DeviceBuffer(data.nbytes), cuda.PinnedBuffer(96)
    try:
        cuda.copy_to_device_async(device, data, stream)
        cuda.copy_to_host_async(pinned, device, data.nbytes, stream)
        stream.synchronize()
        np.testing.assert_array_equal(pinned.view(data.dtype, (4, 6)), data)
    finally:
        for resource in (pinned, device, stream):
            resource.close()
            resource.close()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_an_impossible_allocation_is_out_of_memory():
    cuda.set_device(0)
    with pytest.raises(OutOfMemory, match="cudaMalloc failed: cudaErrorMemoryAllocation"):
        cuda.DeviceBuffer(1 << 50)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_a_captured_graph_replays_its_copies_on_new_data():
    cuda.set_device(0)
    stream = cuda.Stream()
    pinned_in, pinned_out = cuda.PinnedBuffer(64), cuda.PinnedBuffer(64)
    device = cuda.DeviceBuffer(64)
    try:
        cuda.memset_async(device, 0, stream)
        stream.synchronize()

        def work() -> None:
            cuda.copy_to_device_async(device, pinned_in.view(np.dtype(np.float32), (16,)), stream)
            cuda.copy_to_host_async(pinned_out, device, 64, stream)

        graph = cuda.Graph(stream, work)
        for value in (1.0, 7.0):  # the graph reads the pinned buffer's contents at replay
            pinned_in.view(np.dtype(np.float32), (16,))[:] = value
            graph.launch(stream)
            stream.synchronize()
            assert (pinned_out.view(np.dtype(np.float32), (16,)) == value).all()
        graph.close()
        graph.close()
    finally:
        for resource in (pinned_in, pinned_out, device, stream):
            resource.close()


def test_cuda_uuid_bytes_are_written_as_nvml_writes_them():
    raw = bytes.fromhex("5f3a9c1e7b2d4e8fa0b1c2d3e4f50617")
    assert nvml_uuid(raw) == "GPU-5f3a9c1e-7b2d-4e8f-a0b1-c2d3e4f50617"
