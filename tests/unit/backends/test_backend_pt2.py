"""The PyTorch backend on real torch.export programs: signature, inference, errors, devices."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from batchserve.backends.selection import create_backend, runtime_name  # noqa: E402
from batchserve.backends.torch_program import read_pt2_signature  # noqa: E402
from batchserve.backends.torch_pt2 import TorchBackend  # noqa: E402
from batchserve.backends.torch_runner import fits_buffer, stage  # noqa: E402
from batchserve.core.device import CPU, Device  # noqa: E402
from batchserve.core.errors import (  # noqa: E402
    BackendError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.core.signature import DYNAMIC  # noqa: E402
from batchserve.proto.model_config_pb2 import ModelConfig  # noqa: E402
from pt2_models import (  # noqa: E402
    ROW,
    WIDE_COPIES,
    Huge,
    Mlp,
    SlowOnGpu,
    TwoInputs,
    Wide,
    mlp_program,
    save_program,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs torch with CUDA and an NVIDIA GPU")


def loaded(path: Path, config: ModelConfig | None = None, device: Device = CPU) -> TorchBackend:
    backend = TorchBackend()
    backend.load(path, config or ModelConfig(name="m", max_batch_size=32), device)
    return backend


def eager(module: torch.nn.Module, *arrays: np.ndarray) -> object:
    with torch.no_grad():
        return module.eval()(*(torch.from_numpy(a) for a in arrays))


def test_the_runtime_is_chosen_by_suffix_or_by_triton_style_names(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    assert runtime_name(ModelConfig(), path) == "pytorch"
    assert runtime_name(ModelConfig(backend="pytorch", platform="torch_export"), path) == "pytorch"
    assert isinstance(create_backend(ModelConfig(), path), TorchBackend)
    with pytest.raises(
        ModelConfigError, match="field 'platform' is 'torch_aoti': batchserve does not support"
    ):
        runtime_name(ModelConfig(platform="torch_aoti"), path)


def test_signature_names_dict_outputs_by_key_and_keeps_the_batch_axis_dynamic(
    tmp_path: Path,
) -> None:
    signature = read_pt2_signature(mlp_program(tmp_path / "model.pt2"))
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.inputs] == [
        ("x", "FP32", (DYNAMIC, ROW))
    ]
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.outputs] == [
        ("y", "FP32", (DYNAMIC, 4)),
        ("hidden", "FP32", (DYNAMIC, 4)),
    ]


def test_tuple_outputs_get_tritons_ordinal_names_and_inputs_keep_forwards(tmp_path: Path) -> None:
    example = (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, ROW))
    signature = read_pt2_signature(save_program(tmp_path / "model.pt2", TwoInputs(), example))
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.inputs] == [
        ("ids", "INT64", (DYNAMIC, 3)),
        ("x", "FP32", (DYNAMIC, ROW)),
    ]
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.outputs] == [
        ("OUTPUT__0", "INT64", (DYNAMIC, 3)),
        ("OUTPUT__1", "FP32", (DYNAMIC, 1)),
    ]


def test_every_batch_size_matches_the_eager_module(tmp_path: Path) -> None:
    module = Mlp()
    backend = loaded(save_program(tmp_path / "model.pt2", module, (torch.randn(3, ROW),)))
    assert backend.device == CPU
    for batch in (1, 5, 32):
        x = np.random.default_rng(batch).standard_normal((batch, ROW)).astype(np.float32)
        x.flags.writeable = False  # as a request's frombuffer view arrives
        got = backend.infer({"x": x})
        want = eager(module, x.copy())
        assert isinstance(want, dict)
        for name in ("y", "hidden"):
            np.testing.assert_allclose(got[name], want[name].numpy(), rtol=1e-6, atol=1e-6)
            assert got[name].shape == (batch, 4)
    assert list(backend.infer({"x": np.ones((2, ROW), np.float32)}, ["hidden"])) == ["hidden"]
    assert backend.memory_bytes() is None  # the CPU probe measures the process
    backend.unload()
    backend.unload()
    with pytest.raises(BackendError, match="not loaded"):
        backend.infer({"x": np.ones((1, ROW), np.float32)})


def test_integer_inputs_and_ordinal_outputs_run(tmp_path: Path) -> None:
    example = (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, ROW))
    backend = loaded(save_program(tmp_path / "model.pt2", TwoInputs(), example))
    ids = np.arange(12, dtype=np.int64).reshape(4, 3)
    out = backend.infer({"ids": ids, "x": np.ones((4, ROW), np.float32)})
    np.testing.assert_array_equal(out["OUTPUT__0"], ids * 3 + 7)
    np.testing.assert_array_equal(out["OUTPUT__1"], np.full((4, 1), ROW, np.float32))


def test_keyword_inputs_are_named_by_their_keyword(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    example = {"ids": torch.zeros(2, 3, dtype=torch.int64), "x": torch.zeros(2, ROW)}
    shapes = {"ids": {0: batch}, "x": {0: batch}}
    program = torch.export.export(TwoInputs(), (), example, dynamic_shapes=shapes)
    torch.export.save(program, str(tmp_path / "model.pt2"))
    backend = loaded(tmp_path / "model.pt2")
    assert [t.name for t in backend.signature.inputs] == ["ids", "x"]
    out = backend.infer({"x": np.ones((2, ROW), np.float32), "ids": np.ones((2, 3), np.int64)})
    np.testing.assert_array_equal(out["OUTPUT__0"], np.full((2, 3), 10))


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        ({"x": np.ones((2, ROW), np.float64)}, None, r"input 'x' has numpy dtype float64.*FP32"),
        ({"x": np.ones((2, ROW + 1), np.float32)}, None, r"input 'x' has shape \[2, 9\]"),
        ({"x": np.ones((2, ROW, 1), np.float32)}, None, r"input 'x' has shape \[2, 8, 1\]"),
        ({"x": np.ones((65, ROW), np.float32)}, None, r"shape\[0\] to be <= 64, but got 65"),
        ({"z": np.ones((2, ROW), np.float32)}, None, r"unknown \['z'\], missing \['x'\]"),
        ({"x": np.ones((2, ROW), np.float32)}, ["nope"], r"unknown \['nope'\]"),
    ],
)
def test_bad_inputs_are_invalid_arguments_naming_the_tensor(
    tmp_path: Path, inputs: dict[str, np.ndarray], outputs: list[str] | None, message: str
) -> None:
    backend = loaded(mlp_program(tmp_path / "model.pt2"))
    with pytest.raises(InvalidArgument, match=message):
        backend.infer(inputs, outputs)


def test_a_max_batch_size_beyond_the_programs_batch_dim_is_refused_at_load(
    tmp_path: Path,
) -> None:
    path = mlp_program(tmp_path / "model.pt2")
    with pytest.raises(ModelConfigError, match=r"batches of at most 64.*max_batch_size is 65"):
        loaded(path, ModelConfig(name="m", max_batch_size=65))


def test_a_real_cpu_allocation_failure_is_out_of_memory(tmp_path: Path) -> None:
    backend = loaded(save_program(tmp_path / "model.pt2", Huge(), (torch.ones(2, ROW),)))
    with pytest.raises(OutOfMemory, match="can't allocate memory"):
        backend.infer({"x": np.ones((1, ROW), np.float32)})


def test_a_gpu_instance_without_cuda_is_device_unavailable_unless_fallback_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if HAS_CUDA:
        pytest.skip("this machine's torch has CUDA")
    path = mlp_program(tmp_path / "model.pt2")
    with pytest.raises(DeviceUnavailable, match=r"placed on gpu:0.*allow_cpu_fallback"):
        loaded(path, device=Device("gpu", 0))
    config = ModelConfig(name="m", max_batch_size=32)
    config.batchserve.allow_cpu_fallback = True
    backend = loaded(path, config, Device("gpu", 0))
    assert backend.device == CPU
    assert "running on the CPU (allow_cpu_fallback)" in caplog.text
    assert backend.infer({"x": np.ones((1, ROW), np.float32)})["y"].shape == (1, 4)


def test_a_file_that_is_not_an_archive_is_a_model_config_error(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(b"not a zip")
    with pytest.raises(ModelConfigError, match=r"not a readable torch.export archive"):
        loaded(path)


def test_without_torch_loading_says_how_to_install_it(tmp_path: Path) -> None:
    """In a fresh interpreter where ``import torch`` fails, as on a server without it."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from pathlib import Path\n"
        "from batchserve.backends.torch_pt2 import TorchBackend\n"
        "from batchserve.devices.placement import CPU\n"
        "from batchserve.core.errors import ModelConfigError\n"
        "from batchserve.proto.model_config_pb2 import ModelConfig\n"
        "try:\n"
        "    TorchBackend().load(Path(sys.argv[1]), ModelConfig(name='m'), CPU)\n"
        "except ModelConfigError as exc:\n"
        "    print(exc.message)\n"
    )
    path = mlp_program(tmp_path / "model.pt2")
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    assert "needs torch, which is not installed: pip install 'batchserve[export]'" in done.stdout


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_the_program_runs_on_its_own_stream_and_matches_the_cpu(tmp_path: Path) -> None:
    path = mlp_program(tmp_path / "model.pt2")
    cpu, gpu = loaded(path), loaded(path, device=Device("gpu", 0))
    assert gpu.device == Device("gpu", 0)
    for batch in (1, 7, 32, 33):  # 33: over max_batch_size, run without the fixed buffers
        x = np.random.default_rng(batch).standard_normal((batch, ROW)).astype(np.float32)
        want, got = cpu.infer({"x": x}), gpu.infer({"x": x})
        for name in ("y", "hidden"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    memory = gpu.memory_bytes()
    assert memory is not None
    assert memory >= 32 * ROW * 4  # at least the input buffer
    gpu.unload()
    assert gpu.memory_bytes() is None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("busy_wait", [False, True], ids=["blocking", "busy_wait_events"])
def test_while_the_gpu_computes_the_thread_blocks_unless_busy_wait_events(
    tmp_path: Path, busy_wait: bool
) -> None:
    """By default the instance's thread sleeps while its batch runs on the GPU, leaving its
    core to request handling; ``busy_wait_events`` makes it spin, as Triton's field does."""
    path = save_program(tmp_path / "model.pt2", SlowOnGpu(), (torch.randn(3, ROW),))
    config = ModelConfig(name="slow", max_batch_size=32)
    config.optimization.cuda.busy_wait_events = busy_wait
    gpu = loaded(path, config, Device("gpu", 0))
    x = np.random.default_rng(0).standard_normal((4, ROW)).astype(np.float32)
    gpu.infer({"x": x})  # first run: the libraries' one-time set-up
    wall, cpu = time.perf_counter(), time.thread_time()
    np.testing.assert_array_equal(gpu.infer({"x": x})["y"], x)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    gpu.unload()
    assert wall > 0.02, f"the GPU took {wall * 1e3:.1f} ms: too little to tell waits apart"
    if busy_wait:
        assert cpu > 0.5 * wall, f"{cpu * 1e3:.1f} ms of CPU in {wall * 1e3:.1f} ms"
    else:
        assert cpu < 0.3 * wall, f"{cpu * 1e3:.1f} ms of CPU in {wall * 1e3:.1f} ms"


@pytest.mark.parametrize(
    ("shape", "rows", "fits"),
    [
        ((7, 4), 7, True),
        ((32, 4), 32, True),
        ((33, 4), 33, False),  # over max_batch_size: its rows would not fit (seen on a GPU)
        ((7, 5), 7, False),
        ((6, 4), 7, False),
    ],
)
def test_an_output_goes_through_its_fixed_buffer_only_where_it_fits(
    shape: tuple[int, ...], rows: int, fits: bool
) -> None:
    assert fits_buffer(shape, (32, 4), rows) is fits


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_a_batch_is_staged_into_the_head_of_its_buffer(dtype: type) -> None:
    buffer = torch.full((8, 3), 7).to(getattr(torch, np.dtype(dtype).name))
    batch = np.arange(30).reshape(5, 6).astype(dtype)[:, ::2]  # a strided view, as requests can be
    stage(torch, buffer[:5], batch)
    np.testing.assert_array_equal(buffer[:5].numpy(), batch)
    assert (buffer[5:].numpy() == 7).all()


def test_a_dtype_numpy_cannot_view_is_staged_by_torch() -> None:
    buffer = torch.zeros((4, 2), dtype=torch.bfloat16)
    stage(torch, buffer[:2], np.ones((2, 2), np.float32))
    assert buffer.float().sum().item() == 4.0


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_are_captured_per_size_and_batches_padded_up(tmp_path: Path) -> None:
    path = mlp_program(tmp_path / "model.pt2")
    config = ModelConfig(name="m", max_batch_size=32)
    config.dynamic_batching.preferred_batch_size.extend([4, 16])
    config.optimization.cuda.graphs = True
    cpu, gpu = loaded(path), loaded(path, config, Device("gpu", 0))
    assert gpu.graph_batch_sizes == (4, 16)
    for batch in (1, 3, 4, 5, 16, 17, 32, 2):  # padded to 4 or 16, or eager above 16
        x = np.random.default_rng(batch).standard_normal((batch, ROW)).astype(np.float32)
        want, got = cpu.infer({"x": x}), gpu.infer({"x": x})
        assert got["y"].shape == (batch, 4)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
    assert loaded(path, config).graph_batch_sizes == ()  # ignored on the CPU
    gpu.unload()


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_a_run_on_lent_memory_gives_the_allocator_s_growth_back(tmp_path: Path) -> None:
    """torch's caching allocator keeps a run's blocks for the next; after a run on memory
    lent beyond the reservation (``release_after_next_run``) they go back to the device,
    so that the memory returns with the loan."""
    rows = 4096  # 1 GiB of intermediate, twice
    path = save_program(tmp_path / "wide.pt2", Wide(), (torch.randn(3, ROW),), batch_max=rows)
    gpu = loaded(path, ModelConfig(name="wide", max_batch_size=rows), Device("gpu", 0))
    x = np.random.default_rng(0).standard_normal((rows, ROW)).astype(np.float32)
    want = 2 * WIDE_COPIES * x.sum(axis=1, keepdims=True)
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_reserved(0)
    np.testing.assert_allclose(gpu.infer({"x": x})["y"], want, rtol=1e-3, atol=1)
    assert torch.cuda.memory_reserved(0) - before >= 1 << 30, "kept for the next run"
    gpu.release_after_next_run()
    np.testing.assert_allclose(gpu.infer({"x": x})["y"], want, rtol=1e-3, atol=1)
    assert torch.cuda.memory_reserved(0) - before < 64 << 20, "given back after the loan"
    gpu.unload()


@pytest.mark.gpu
@needs_cuda
def test_a_real_cuda_out_of_memory_is_out_of_memory(tmp_path: Path) -> None:
    path = save_program(tmp_path / "model.pt2", Huge(), (torch.ones(2, ROW),))
    gpu = loaded(path, device=Device("gpu", 0))
    with pytest.raises(OutOfMemory, match="OutOfMemoryError"):
        gpu.infer({"x": np.ones((1, ROW), np.float32)})
    gpu.unload()
