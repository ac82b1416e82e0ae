"""Measuring instances for real: RSS of a real ONNX Runtime session, cgroup files, NVML."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable, OutOfMemory
from batchserve.devices.host_memory import (
    cgroup_memory_limit,
    cpu_total_bytes,
    physical_memory_bytes,
)
from batchserve.devices.placement import gpu_count
from batchserve.models.instance_loader import probe_row_positions
from batchserve.models.memory_probe import (
    ProcessMemory,
    device_total_bytes,
    gpu_meter,
    gpu_total_bytes,
    probe_backend,
    probe_batch_sizes,
    probe_instance,
)
from batchserve.models.model_table import InstanceMemory
from batchserve.proto.model_config_pb2 import TYPE_FP32, TYPE_INT64, ModelConfig, ModelInput
from batchserve.scheduler.memory import (
    MemoryBudgets,
    MemoryProfile,
    MemorySample,
    arena_limit_bytes,
    derive_cap,
)
from onnx import TensorProto, helper, numpy_helper

MIB = 1 << 20
WIDTH = 4096
HIDDEN_BYTES_PER_SAMPLE = WIDTH * 4  # one FP32 row of the wide hidden layer
NO_GPU = pytest.mark.skipif(gpu_count() > 0, reason="checks the behaviour without a GPU")
NEEDS_GPU = pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU")


@pytest.fixture
def wide_hidden(tmp_path: Path) -> Path:
    """x[batch, 64] -> relu(x @ w1)[batch, 4096] -> @ w2 -> y[batch, 8]: 16 KiB per sample
    lives only inside the graph, so only the runtime's own memory can show it."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((64, WIDTH)).astype(np.float32),
        "w2": rng.standard_normal((WIDTH, 8)).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "wide_hidden",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "wide_hidden.onnx"
    onnx.save(model, str(path))
    return path


def wide_config(max_batch_size: int = 256) -> ModelConfig:
    return ModelConfig(
        name="wide_hidden",
        max_batch_size=max_batch_size,
        input=[ModelInput(name="x", data_type=TYPE_FP32, dims=[64])],
    )


def test_probe_measures_the_per_sample_cost_of_a_real_session(wide_hidden: Path):
    backend = OnnxBackend()
    profile = probe_backend(backend, wide_hidden, wide_config(), CPU)
    assert [s.batch_size for s in profile.samples] == [1, 64, 256]
    measured = [s.nbytes for s in profile.samples]
    assert measured == sorted(measured)  # the high-water mark
    assert 0.5 * HIDDEN_BYTES_PER_SAMPLE <= profile.per_sample_bytes <= 4 * HIDDEN_BYTES_PER_SAMPLE
    assert profile.fixed_bytes >= 0
    assert backend.infer({"x": np.ones((3, 64), np.float32)})["y"].shape == (3, 8)


def _two_convolutions(path: Path) -> Path:
    """Two padded 3x3 convolutions of 32 channels over free height and width, pooled."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.random((32, 3, 3, 3), dtype=np.float32), "first"),
        numpy_helper.from_array(rng.random((32, 32, 3, 3), dtype=np.float32), "second"),
    ]
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["image", "first"], ["a"], kernel_shape=[3, 3], pads=pads),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "second"], ["c"], kernel_shape=[3, 3], pads=pads),
        helper.make_node("GlobalAveragePool", ["c"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "h", "w"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 32, 1, 1])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("pattern", ["1", "0"], ids=["memory-pattern", "no-pattern"])
def test_the_profile_covers_what_a_session_holds_once_it_has_run_its_cap_again(
    tmp_path: Path, pattern: str
) -> None:
    """With ORT's memory pattern, a shape's second run allocates its traced plan beside what
    the first left in the arena: measured after one run, this CNN's profile said 92 MiB at
    its cap of 16 where the session held 161 MiB."""
    model = _two_convolutions(tmp_path / "cnn.onnx")
    config = ModelConfig(
        name="cnn",
        max_batch_size=16,
        input=[ModelInput(name="image", data_type=TYPE_FP32, dims=[3, 128, 128])],
    )
    config.parameters["enable_mem_pattern"].string_value = pattern
    held = ProcessMemory()
    backend = OnnxBackend()
    profile = probe_backend(backend, model, config, CPU)
    batch = np.zeros((16, 3, 128, 128), np.float32)
    for _ in range(2):
        backend.infer({"image": batch})
    # glibc keeps this test's own freed batches on its heap; they are the request's, not the
    # session's, so they are allowed for
    assert held() <= profile.predict(16) + 2 * batch.nbytes
    assert profile.predict(16) > 16 * 32 * 128 * 128 * 4  # a 32-channel map of every image


def test_an_arena_sized_from_the_profile_refuses_batches_far_above_the_cap(wide_hidden: Path):
    profile = probe_backend(OnnxBackend(), wide_hidden, wide_config(), CPU)
    cap = derive_cap(profile, profile.predict(64), 256)
    assert cap == 64
    capped = OnnxBackend(memory_limit_bytes=arena_limit_bytes(profile, cap))
    capped.load(wide_hidden, wide_config(), CPU)
    assert capped.infer({"x": np.ones((cap, 64), np.float32)})["y"].shape == (cap, 8)
    with pytest.raises(OutOfMemory, match="model 'wide_hidden'"):
        capped.infer({"x": np.ones((cap * 16, 64), np.float32)})


@NO_GPU
def test_a_gpu_instance_that_falls_back_is_measured_on_the_cpu(wide_hidden: Path):
    config = wide_config(64)
    config.batchserve.allow_cpu_fallback = True
    backend = OnnxBackend()
    profile = probe_backend(backend, wide_hidden, config, Device("gpu", 0))
    assert backend.device == CPU
    assert [s.batch_size for s in profile.samples] == [1, 16, 64]


@NO_GPU
def test_a_gpu_instance_without_a_gpu_is_refused_by_the_backend(wide_hidden: Path):
    with pytest.raises(DeviceUnavailable, match="allow_cpu_fallback"):
        probe_backend(OnnxBackend(), wide_hidden, wide_config(), Device("gpu", 0))


def test_probe_runs_ascending_and_keeps_the_high_water_mark():
    ran: list[int] = []
    readings = iter([300, 100, 900, 800])  # memory handed back between batches still counts

    profile = probe_instance(ran.append, lambda: next(readings), [64, 1, 8, 8])
    assert ran == [1, 8, 64, 64]
    assert [(s.batch_size, s.nbytes) for s in profile.samples] == [(1, 300), (8, 300), (64, 900)]


def test_the_largest_size_runs_twice_and_counts_what_the_second_run_held():
    ran: list[int] = []
    readings = iter([100, 400, 1000, 1700])

    def run(size: int) -> None:
        ran.append(size)
        if ran.count(size) == 1 and size == 16:
            time.sleep(0.05)  # the first run of a shape pays for what the second reuses

    profile = probe_instance(run, lambda: next(readings), [1, 4, 16])
    assert ran == [1, 4, 16, 16]
    assert [(s.batch_size, s.nbytes) for s in profile.samples] == [(1, 100), (4, 400), (16, 1700)]
    assert profile.predict(16) >= 1700
    assert profile.samples[-1].run_ns < 50_000_000  # the faster of its two runs


def test_probe_skips_sizes_predicted_to_exceed_the_limit():
    ran: list[int] = []
    profile = probe_instance(ran.append, lambda: 1000 * ran[-1], [1, 2, 1000], limit_bytes=10_000)
    assert ran == [1, 2, 2]  # the largest size that fits runs twice
    assert profile == MemoryProfile(0, 1000, profile.samples)


def test_probe_needs_positive_batch_sizes():
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        probe_instance(lambda _: None, lambda: 0, [0, 4])
    with pytest.raises(ValueError, match="not empty"):
        probe_instance(lambda _: None, lambda: 0, [])


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [
        (0, (1,)),
        (1, (1,)),
        (2, (1, 2)),
        (5, (1, 2, 5)),
        (64, (1, 16, 64)),
        (256, (1, 64, 256)),
        (1024, (1, 64, 256, 1024)),
        (2**31 - 1, (1, 64, 4096, 262144, 16777216, 536870911, 2**31 - 1)),
    ],
)
def test_probe_batch_sizes(max_batch_size: int, sizes: tuple[int, ...]):
    assert probe_batch_sizes(max_batch_size) == sizes


def test_process_memory_sees_a_touched_allocation():
    meter = ProcessMemory()
    block = np.ones(64 * MIB // 8)
    assert meter() >= 60 * MIB
    del block


def test_process_memory_counts_a_peak_freed_before_the_reading():
    meter = ProcessMemory()
    # Only a new process-wide peak is visible once freed: rise above the highest so far.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    size = max(0, peak - resident) + 128 * MIB
    block = np.ones(size // 8)
    del block
    assert meter() >= 120 * MIB


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_is_the_tightest_over_the_path(tmp_path: Path):
    write(tmp_path / "proc_cgroup", "0::/kubepods/pod1/ctr\n")
    write(tmp_path / "fs" / "kubepods" / "memory.max", "max\n")
    write(tmp_path / "fs" / "kubepods" / "pod1" / "memory.max", "2147483648\n")
    write(tmp_path / "fs" / "kubepods" / "pod1" / "ctr" / "memory.max", "4294967296\n")
    assert cgroup_memory_limit(tmp_path / "fs", tmp_path / "proc_cgroup") == 2 << 30


def test_cgroup_v2_in_its_own_namespace_reads_the_root(tmp_path: Path):
    write(tmp_path / "proc_cgroup", "0::/\n")
    write(tmp_path / "fs" / "memory.max", "536870912\n")
    assert cgroup_memory_limit(tmp_path / "fs", tmp_path / "proc_cgroup") == 512 * MIB


def test_cgroup_v1_reads_the_memory_controller(tmp_path: Path):
    write(tmp_path / "proc_cgroup", "garbage\n2:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    write(tmp_path / "fs" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path / "fs" / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "1073741824")
    write(tmp_path / "fs" / "cpu" / "docker" / "abc" / "memory.limit_in_bytes", "1")
    assert cgroup_memory_limit(tmp_path / "fs", tmp_path / "proc_cgroup") == 1 << 30


def test_no_cgroup_files_means_no_limit(tmp_path: Path):
    assert cgroup_memory_limit(tmp_path / "fs", tmp_path / "absent") is None


def test_cpu_total_is_physical_memory_or_less():
    assert 0 < cpu_total_bytes() <= physical_memory_bytes()
    assert device_total_bytes(CPU) == cpu_total_bytes()
    budgets = MemoryBudgets(parse_budgets("cpu=0.5"), device_total_bytes)
    assert budgets.for_device(CPU).total_bytes == cpu_total_bytes() // 2


@NO_GPU
def test_gpu_total_without_a_gpu_is_device_unavailable():
    with pytest.raises(DeviceUnavailable, match="NVML"):
        gpu_total_bytes(0)


@pytest.mark.gpu
@NEEDS_GPU
def test_gpu_total_and_meter_see_real_device_memory():
    from batchserve.devices import cuda

    assert gpu_total_bytes(0) > 0
    with gpu_meter(0) as meter:
        buffer = cuda.DeviceBuffer(64 * MIB)
        try:
            assert meter() >= 64 * MIB
        finally:
            buffer.close()


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"
)
def test_probe_measures_a_cuda_session(wide_hidden: Path):
    backend = OnnxBackend()
    profile = probe_backend(backend, wide_hidden, wide_config(), Device("gpu", 0))
    assert backend.device == Device("gpu", 0)
    assert profile.predict(256) >= 256 * HIDDEN_BYTES_PER_SAMPLE
    backend.unload()


def test_a_probe_row_holds_the_free_length_or_the_warm_up_sample_s() -> None:
    config = ModelConfig(name="seq", max_batch_size=8)
    config.input.add(name="tokens", data_type=TYPE_INT64, dims=[-1])
    config.input.add(name="lengths", data_type=TYPE_INT64, dims=[1])
    config.batchserve.sequence_length_input = "lengths"
    config.dynamic_batching.SetInParent()
    sample = {"tokens": np.zeros((1, 20), np.int64), "lengths": np.array([[20]], np.int64)}
    assert probe_row_positions(config, 128, None) == 128
    assert probe_row_positions(config, 128, sample) == 20
    config.max_batch_size = 0
    assert probe_row_positions(config, 128, sample) == 0  # no batch axis: no positions counted


def test_a_probe_row_of_an_image_holds_the_free_axes_pixels() -> None:
    config = ModelConfig(name="cnn", max_batch_size=8)
    config.input.add(name="image", data_type=TYPE_FP32, dims=[3, -1, -1])
    assert probe_row_positions(config, 128, None) == 128 * 128
    assert probe_row_positions(config, 128, {"image": np.zeros((1, 3, 20, 30), np.float32)}) == 600


def test_the_probe_s_timed_batches_are_counted_as_the_batch_times_count_them() -> None:
    samples = (MemorySample(1, 100, 2000), MemorySample(4, 400, 5000), MemorySample(8, 800))
    profile = MemoryProfile(0, 100, samples)
    rows = InstanceMemory(CPU, profile, 800, 8)
    assert rows.timed_runs() == [(1, 2000), (4, 5000)]  # an untimed batch is left out
    pixels = InstanceMemory(CPU, profile, 800, 8, probe_row_positions=128 * 128)
    assert pixels.timed_runs() == [(128 * 128, 2000), (4 * 128 * 128, 5000)]
