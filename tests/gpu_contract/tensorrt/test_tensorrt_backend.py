"""The TensorRT backend's load, infer and unload paths against TensorRT's real Python API.

No engine can be deserialised without a GPU, so the runtime, engine and execution contexts are
checked fakes of TensorRT's own classes (``pybind_fakes``): every member the backend touches
must exist in this TensorRT major, and every call must fit its signature. They describe an
engine computing ``y = x[:, :4] + x[:, 4:]`` with two optimisation profiles, and compute it
when executed, on CUDA devices simulated in host memory (``HostCuda``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from batchserve.backends.tensorrt import TensorRTBackend
from batchserve.core.device import Device
from batchserve.models.model_config import parse_pbtxt
from cuda.bindings import runtime as cudart

from tests.gpu_contract.host_cuda import HostCuda, SimulatedGpu, uuid_text
from tests.gpu_contract.pybind_fakes import FakeFactory

PLAN = b"serialised engine"
NAMES = ("x", "y")
# Each profile's (min, opt, max) shape of x: batches 1-4 tuned for 4, 5-16 tuned for 16.
PROFILES = (((1, 8), (4, 8), (4, 8)), ((5, 8), (16, 8), (16, 8)))
SCRATCH = 1 << 20
GPU = SimulatedGpu(bytes(range(16)))
CONFIG = """
name: "trt"
platform: "tensorrt_plan"
max_batch_size: 16
input [{ name: "x" data_type: TYPE_FP32 dims: [8] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]
dynamic_batching { preferred_batch_size: [4, 16] }
"""
GRAPHS = "optimization { cuda { graphs: true } }"


def compute(x: np.ndarray) -> np.ndarray:
    return x[:, :4] + x[:, 4:]


@dataclass
class FakeContext:
    """One execution context's state, and its answers to the backend's calls."""

    trt: ModuleType
    gpu: HostCuda
    profile: int | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    addresses: dict[str, int] = field(default_factory=dict)
    scratch: tuple[int, int] | None = None
    batches: list[int] = field(default_factory=list)

    def answers(self) -> dict[str, Callable[..., Any]]:
        return {
            "set_device_memory": self.set_device_memory,
            "set_optimization_profile_async": self.set_optimization_profile_async,
            "set_input_shape": self.set_input_shape,
            "get_tensor_shape": self.get_tensor_shape,
            "set_tensor_address": self.set_tensor_address,
            "execute_async_v3": self.execute_async_v3,
        }

    def set_device_memory(self, memory: int, size: int) -> None:
        self.scratch = (memory, size)

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        self.profile = index
        return 0 <= index < len(PROFILES)

    def set_input_shape(self, name: str, shape: Any) -> bool:
        low, _, high = PROFILES[self.profile or 0]
        self.shapes[name] = tuple(shape)
        return name == "x" and all(
            lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)
        )

    def get_tensor_shape(self, name: str) -> Any:
        rows = self.shapes.get("x", (-1,))[0]
        return self.trt.Dims((rows, 8) if name == "x" else (rows, 4))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.addresses[name] = memory
        return name in NAMES

    def execute_async_v3(self, stream_handle: int) -> bool:
        rows = self.shapes["x"][0]
        self.gpu.enqueue(lambda: self._run(rows), stream_handle)
        return True

    def _run(self, rows: int) -> None:
        self.batches.append(rows)
        x = np.frombuffer(self.gpu.read(self.addresses["x"], rows * 32), np.float32)
        self.gpu.write(self.addresses["y"], compute(x.reshape(rows, 8)).tobytes())


@dataclass
class World:
    """The fakes of one test: the simulated GPU, the engine, and the contexts made from it."""

    gpu: HostCuda
    engine: Any
    contexts: list[FakeContext]
    plan: Path


@pytest.fixture
def world(
    trt: ModuleType,
    fakes: FakeFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nvml_reports: Callable[[dict[str, str]], None],
) -> World:
    nvml_reports({"NVML_STUB_GPUS": "1", "NVML_STUB_UUIDS": uuid_text(GPU.uuid)})
    gpu = HostCuda(cudart, [GPU]).install(monkeypatch)
    contexts: list[FakeContext] = []

    def create_execution_context(strategy: Any = None) -> Any:
        contexts.append(FakeContext(trt, gpu))
        return fakes.fake(trt.IExecutionContext, **contexts[-1].answers())

    engine = fakes.fake(
        trt.ICudaEngine,
        num_io_tensors=len(NAMES),
        get_tensor_name=lambda index: NAMES[index],
        get_tensor_mode=lambda name: getattr(
            trt.TensorIOMode, "INPUT" if name == "x" else "OUTPUT"
        ),
        get_tensor_shape=lambda name: trt.Dims((-1, 8) if name == "x" else (-1, 4)),
        get_tensor_dtype=lambda name: trt.DataType.FLOAT,
        get_tensor_format=lambda name: trt.TensorFormat.LINEAR,
        is_shape_inference_io=False,
        get_tensor_profile_shape=lambda name, index: [trt.Dims(s) for s in PROFILES[index]],
        num_optimization_profiles=len(PROFILES),
        device_memory_size_v2=SCRATCH,
        create_execution_context=create_execution_context,
    )

    runtime_class = trt.Runtime

    def runtime(logger: Any) -> Any:
        return fakes.fake(
            runtime_class,
            deserialize_cuda_engine=lambda data: engine if bytes(data) == PLAN else None,
        )

    monkeypatch.setattr(trt, "Runtime", fakes.constructor(runtime_class, runtime))
    plan = tmp_path / "trt" / "1" / "model.plan"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(PLAN)
    return World(gpu, engine, contexts, plan)


def load(world: World, extra: str = "") -> TensorRTBackend:
    backend = TensorRTBackend()
    backend.load(world.plan, parse_pbtxt(CONFIG + extra), Device("gpu", 0))
    return backend


def test_load_makes_a_context_per_profile_on_one_shared_scratch(
    world: World, trt: ModuleType
) -> None:
    backend = load(world)
    try:
        strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
        calls = world.engine.create_execution_context.call_args_list
        assert [call.args for call in calls] == [(strategy,), (strategy,)]
        assert [c.profile for c in world.contexts] == [0, 1]
        scratches = {c.scratch for c in world.contexts}
        assert len(scratches) == 1
        ((pointer, size),) = scratches
        assert len(world.gpu.device[pointer]) == size >= SCRATCH
        assert [(t.name, t.datatype.wire) for t in backend.signature.inputs] == [("x", "FP32")]
        assert [(t.name, t.datatype.wire) for t in backend.signature.outputs] == [("y", "FP32")]
        # Buffers sized once, for the largest shapes of any profile: 16 rows.
        assert backend.memory_bytes() == SCRATCH + 16 * 8 * 4 + 16 * 4 * 4
    finally:
        backend.unload()


@pytest.mark.parametrize(("rows", "profile"), [(3, 0), (4, 0), (10, 1), (16, 1)])
def test_infer_runs_a_batch_on_the_profile_tuned_nearest(
    world: World, rows: int, profile: int
) -> None:
    backend = load(world)
    try:
        x = np.random.default_rng(rows).standard_normal((rows, 8)).astype(np.float32)
        np.testing.assert_allclose(backend.infer({"x": x})["y"], compute(x), rtol=1e-6)
        assert [c.batches for c in world.contexts if c.batches] == [[rows]]
        assert world.contexts[profile].batches == [rows]
    finally:
        backend.unload()


def test_cuda_graphs_are_captured_per_preferred_size_and_replayed(world: World) -> None:
    backend = load(world, GRAPHS)
    try:
        assert backend.graph_batch_sizes == (4, 16)
        launches = world.gpu.calls.count("cudaGraphLaunch")
        x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
        np.testing.assert_allclose(backend.infer({"x": x})["y"], compute(x), rtol=1e-6)
        assert world.gpu.calls.count("cudaGraphLaunch") == launches + 1
    finally:
        backend.unload()


def _waits_of_one_batch(world: World, backend: TensorRTBackend) -> list[str]:
    """The CUDA waits an inference makes, with its answer checked (the simulated stream runs
    its work only when waited for)."""
    before = len(world.gpu.calls)
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(backend.infer({"x": x})["y"], compute(x), rtol=1e-6)
    waits = ("cudaStreamSynchronize", "cudaEventRecord", "cudaEventSynchronize")
    return [call for call in world.gpu.calls[before:] if call in waits]


@pytest.mark.parametrize("extra", ["", GRAPHS], ids=["plain", "graphs"])
def test_a_batch_is_waited_for_on_an_event_that_blocks_the_thread(world: World, extra: str) -> None:
    backend = load(world, extra)
    try:
        assert list(world.gpu.events.values()) == [
            cudart.cudaEventBlockingSync | cudart.cudaEventDisableTiming
        ]
        assert _waits_of_one_batch(world, backend) == ["cudaEventRecord", "cudaEventSynchronize"]
    finally:
        backend.unload()
    assert world.gpu.leaks() == {}


def test_busy_wait_events_spins_in_stream_synchronize_as_triton_s_field_says(
    world: World,
) -> None:
    backend = load(world, "optimization { cuda { busy_wait_events: true } }")
    try:
        assert world.gpu.events == {}
        assert _waits_of_one_batch(world, backend) == ["cudaStreamSynchronize"]
    finally:
        backend.unload()


@pytest.mark.parametrize("extra", ["", GRAPHS], ids=["plain", "graphs"])
def test_unload_frees_every_buffer_stream_and_graph(world: World, extra: str) -> None:
    backend = load(world, extra)
    x = np.ones((2, 8), np.float32)
    backend.infer({"x": x})
    backend.unload()
    assert world.gpu.leaks() == {}
