"""Opening an ONNX Runtime instance is one step: a failure at any stage releases what the
stages before it built (buffers, stream, session) and surfaces as the error it always was."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.backends import onnx, onnx_gpu
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.onnx_io import BoundRunner, HostMemory
from batchserve.backends.onnx_options import CPU_EP, CUDA_EP
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BackendError, BatchserveError, ModelConfigError
from batchserve.proto.model_config_pb2 import BatchserveOptions, ModelConfig

HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()
GPU0 = Device("gpu", 0)
X = np.ones((2, 8), np.float32)


class RecordingMemory(HostMemory):
    """Host memory that remembers being closed."""

    def __init__(self, made: list[RecordingMemory]) -> None:
        super().__init__()
        self.closed = False
        made.append(self)

    def close(self) -> None:
        super().close()
        self.closed = True


class Built:
    """Every memory and session a load made."""

    def __init__(self) -> None:
        self.memories: list[RecordingMemory] = []
        self.sessions: list[weakref.ref[Any]] = []

    def backend(self, **options: Any) -> OnnxBackend:
        """A new backend; the empty placeholder memory it starts with is not load's doing."""
        backend = OnnxBackend(**options)
        self.memories.clear()
        return backend

    def open_memories(self) -> list[RecordingMemory]:
        return [m for m in self.memories if not m.closed or m._buffers]

    def live_sessions(self) -> int:
        """Sessions someone still holds (once the collector has run)."""
        gc.collect()
        return sum(ref() is not None for ref in self.sessions)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Built:
    record = Built()
    real_session = ort.InferenceSession

    class TrackedSession(real_session):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            record.sessions.append(weakref.ref(self))

    monkeypatch.setattr(ort, "InferenceSession", TrackedSession)
    for module in (onnx, onnx_gpu):
        monkeypatch.setattr(module, "HostMemory", lambda: RecordingMemory(record.memories))
    return record


def failing(error: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


def load_fails(backend: OnnxBackend, path: Path, config: ModelConfig, device: Device) -> str:
    """The message of the BatchserveError load raised; the exception itself is let go, so
    that only the backend could still hold what load built."""
    with pytest.raises(BatchserveError) as caught:
        backend.load(path, config, device)
    error = caught.value
    del caught
    return f"{type(error).__name__}: {error.message}"


def test_a_load_that_succeeds_keeps_its_session_and_buffers(mlp_file: Path, built: Built) -> None:
    """What the failure tests assert released is what a loaded instance holds."""
    backend = built.backend(io_binding=True)
    backend.load(mlp_file, ModelConfig(name="m", max_batch_size=4), CPU)
    [buffers] = built.open_memories()
    assert buffers._buffers
    assert built.live_sessions() == 1
    assert backend.infer({"x": X})["y"].shape == (2, 4)
    backend.unload()
    assert buffers.closed
    assert built.live_sessions() == 0


def _cache_dirs(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    error = ModelConfigError("cannot create TensorRT engine cache /x: Read-only file system")
    monkeypatch.setattr(onnx, "make_cache_dirs", failing(error))
    return f"ModelConfigError: {error.message}"


def _session(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    monkeypatch.setattr(ort, "InferenceSession", failing(RuntimeError("no session")))
    return f"BackendError: {path}: no session"


def _signature(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    error = ModelConfigError(f"{path}: tensor 'x' has unsupported type seq(tensor(float))")
    monkeypatch.setattr(onnx, "session_signature", failing(error))
    return f"ModelConfigError: {error.message}"


def _buffers(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    allocate = HostMemory.allocate

    def second_fails(memory: HostMemory, name: str, nbytes: int) -> None:
        if memory._buffers:
            raise MemoryError("no room for another buffer")
        allocate(memory, name, nbytes)

    monkeypatch.setattr(HostMemory, "allocate", second_fails)
    return "OutOfMemory: model 'm': no room for another buffer"


def _graph_capture(monkeypatch: pytest.MonkeyPatch, path: Path) -> str:
    monkeypatch.setattr(BoundRunner, "capture_graphs", failing(RuntimeError("capture failed")))
    return "BackendError: model 'm': capture failed"


@pytest.mark.parametrize(
    "fault", [_cache_dirs, _session, _signature, _buffers, _graph_capture], ids=lambda f: f.__name__
)
def test_a_failing_stage_releases_what_the_earlier_ones_built(
    fault: Callable[[pytest.MonkeyPatch, Path], str], mlp_file: Path, built: Built
) -> None:
    backend = built.backend(io_binding=True)
    config = ModelConfig(name="m", max_batch_size=4)
    with pytest.MonkeyPatch.context() as patch:
        expected = fault(patch, mlp_file)
        assert load_fails(backend, mlp_file, config, CPU) == expected
    assert built.memories  # the setup's memory at least was opened
    assert built.open_memories() == []
    assert built.live_sessions() == 0
    with pytest.raises(BackendError, match="model 'm' is not loaded"):
        backend.infer({"x": X})
    backend.load(mlp_file, config, CPU)  # nothing left behind stands in the way of a retry
    assert backend.infer({"x": X})["y"].shape == (2, 4)


def test_a_runner_whose_capture_failed_is_closed(mlp_file: Path, built: Built) -> None:
    runners: list[BoundRunner] = []

    def capture(runner: BoundRunner) -> None:
        runners.append(runner)
        raise RuntimeError("capture failed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BoundRunner, "capture_graphs", capture)
        load_fails(
            built.backend(io_binding=True), mlp_file, ModelConfig(name="m", max_batch_size=4), CPU
        )
    [runner] = runners
    assert runner._session is None
    assert not runner._bindings


# --- the GPU stages, with the CUDA provider claimed and the stream's memory recorded -----------


@pytest.fixture
def gpu_memory(monkeypatch: pytest.MonkeyPatch, built: Built) -> list[RecordingMemory]:
    """The memory the GPU setup opens (a stream and buffers on a real GPU)."""
    made: list[RecordingMemory] = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    monkeypatch.setattr(
        onnx_gpu, "_gpu_memory", lambda device, busy_wait: (RecordingMemory(made), "")
    )
    return made


def test_a_failure_after_the_stream_is_opened_closes_it(
    mlp_file: Path,
    gpu_memory: list[RecordingMemory],
    built: Built,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(onnx_gpu, "with_gpu_io", failing(ModelConfigError("bad provider option")))
    message = load_fails(built.backend(), mlp_file, ModelConfig(name="m"), GPU0)
    assert message == "ModelConfigError: bad provider option"
    [memory] = gpu_memory
    assert memory.closed


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_a_gpu_session_that_cannot_start_closes_the_stream_and_drops_the_session(
    mlp_file: Path, gpu_memory: list[RecordingMemory], built: Built
) -> None:
    message = load_fails(built.backend(), mlp_file, ModelConfig(name="m"), GPU0)
    assert message.startswith(f"DeviceUnavailable: {mlp_file}: onnxruntime could not start")
    [memory] = gpu_memory
    assert memory.closed
    assert built.sessions  # ORT built one, on the CPU, which was refused
    assert built.live_sessions() == 0


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_falling_back_to_the_cpu_closes_the_unused_stream_and_keeps_the_session(
    mlp_file: Path, gpu_memory: list[RecordingMemory], built: Built
) -> None:
    config = ModelConfig(name="m", batchserve=BatchserveOptions(allow_cpu_fallback=True))
    backend = built.backend()
    backend.load(mlp_file, config, GPU0)
    [memory] = gpu_memory
    assert memory.closed
    assert backend.device == CPU
    assert built.live_sessions() == 1
    assert backend.infer({"x": X})["y"].shape == (2, 4)
