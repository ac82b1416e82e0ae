"""What the README promises about GPUs, checked on every GPU runtime this machine has.

The runtimes are the PyTorch backend on CUDA torch, ONNX Runtime's CUDA provider and
TensorRT; one that is absent is skipped with the reason (``gpu_models.absent``). Each
promise is one test, marked ``gpu`` (``make gpu-check`` runs them with ``pytest -m gpu``):

(a) the batch cap comes from NVML-measured memory under the budget;
(b) a real out-of-memory on the GPU is split and retried, and every request is answered;
(c) two instances on one GPU overlap;
(d) instances spread over every GPU;
(e) a GPU model falls back to the CPU only when ``allow_cpu_fallback`` says so;
(f) a model left to the server (``KIND_AUTO``, no count) is timed on the CPU and on the GPU,
    and a CPU instance joins the GPU ones exactly where the CPU measured faster.

The first half of (e) needs no GPU, so it also runs here without the marker.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from batchserve.backends.base import Backend
from batchserve.backends.selection import create_backend
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError, OutOfMemory
from batchserve.devices.placement import gpu_count
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_config import load_pbtxt
from batchserve.models.model_table import ServedVersion
from batchserve.models.placing import as_placed
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from batchserve.scheduler.batch_time import crossover
from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.memory import MemoryBudgets, derive_cap
from batchserve.scheduler.padding import SequenceLayout
from batchserve.scheduler.work import WorkItem
from gpu_models import (
    CHAIN_WIDTH,
    RUNTIMES,
    WIDE,
    WIDE_ROW,
    absent,
    chain_reference,
    write_model,
)

GPU0 = "instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]\n"
WIDE_MAX = 32
SAMPLE_BYTES = WIDE * 4


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    reason = absent(request.param)
    if reason is not None:
        pytest.skip(f"{request.param}: {reason}")
    return str(request.param)


def _registry(repository: Path, budget: str | None = None) -> ModelRegistry:
    budgets = MemoryBudgets(parse_budgets(budget), device_total_bytes)
    return ModelRegistry(ModelRepository(repository), 64, budgets)


async def _served(repository: Path, name: str, budget: str | None = None) -> ServedVersion:
    registry = _registry(repository, budget)
    await registry.load(name)
    return registry.get(name)


# (a) ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.anyio
async def test_a_the_batch_cap_comes_from_nvml_measured_memory_under_the_budget(
    runtime: str, tmp_path: Path
) -> None:
    write_model(runtime, tmp_path, "wide", "wide", GPU0, WIDE_MAX)
    roomy = await _served(tmp_path, "wide")
    (measured,) = roomy.memory
    await roomy.close()
    assert measured.device == Device("gpu", 0)
    assert measured.profile.predict(1) > 0  # NVML (or the backend) saw the instance
    if runtime == "tensorrt":  # activations are sized for the largest profile at load
        tight = measured.profile.predict(WIDE_MAX) // 2
        with pytest.raises((ModelConfigError, OutOfMemory), match="needs"):
            await _served(tmp_path, "wide", f"gpu={tight}")
        return
    assert measured.profile.per_sample_bytes >= SAMPLE_BYTES // 2  # the 128 MiB per sample
    budget = measured.profile.predict(WIDE_MAX // 4)
    capped = await _served(tmp_path, "wide", f"gpu={budget}")
    (held,) = capped.memory
    await capped.close()
    assert 1 <= held.batch_cap < WIDE_MAX
    assert held.batch_cap == derive_cap(held.profile, budget, WIDE_MAX)
    assert held.reserved_bytes <= budget


# (b) ---------------------------------------------------------------------------------------


@contextmanager
def _gpu_limited(runtime: str, model_file: Path, rows_that_fit: float) -> Iterator[Backend]:
    """The wide model on gpu:0, allowed about ``rows_that_fit`` samples' worth of memory."""
    config = load_pbtxt(model_file.parent.parent / "config.pbtxt")
    config.name = "wide"
    if runtime == "onnxruntime":
        from batchserve.backends.onnx import OnnxBackend

        backend: Backend = OnnxBackend(memory_limit_bytes=int(rows_that_fit * SAMPLE_BYTES))
        backend.load(model_file, config, Device("gpu", 0))
        yield backend
        backend.unload()
        return
    import torch

    backend = create_backend(config, model_file)
    backend.load(model_file, config, Device("gpu", 0))
    torch.cuda.empty_cache()
    allowed = torch.cuda.memory_reserved(0) + rows_that_fit * SAMPLE_BYTES
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(allowed / total, 0)
    try:
        yield backend
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        backend.unload()


@pytest.mark.gpu
def test_b_a_real_out_of_memory_is_split_and_every_request_answered(
    runtime: str, tmp_path: Path
) -> None:
    if runtime == "tensorrt":
        pytest.skip("tensorrt: every buffer is sized at load, so a batch cannot run out")
    model_file = write_model(runtime, tmp_path, "wide", "wide", GPU0, WIDE_MAX)
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((1, WIDE_ROW)).astype(np.float32) for _ in range(8)]
    loop = asyncio.new_event_loop()
    try:
        items = [WorkItem({"x": x}, 1, ("y",), 1, 0, None, loop.create_future()) for x in requests]
        with _gpu_limited(runtime, model_file, rows_that_fit=5.5) as backend:
            alone = [backend.infer({"x": x})["y"] for x in requests]
            run = BatchRun(backend, items, 0.0, SequenceLayout((), ()))
            outcomes = run()
    finally:
        loop.close()
    assert run.oom_splits >= 1  # 8 samples did not fit: the batch really ran out
    assert 1 <= run.largest_ok < len(requests)
    for x, own, outcome in zip(requests, alone, outcomes, strict=True):
        assert isinstance(outcome, dict), outcome
        np.testing.assert_allclose(outcome["y"], own, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(outcome["y"], x[:, :1], atol=0.1)  # a mean of 32 Mi floats


# (c) ---------------------------------------------------------------------------------------

CHAIN_CONFIG = {
    # torch launches each kernel from Python: captured graphs keep one batch off the GIL
    "pytorch": "dynamic_batching { preferred_batch_size: [8] } "
    "optimization { cuda { graphs: true } }\n",
    "onnxruntime": "",
    "tensorrt": "",
}


def _seconds_for(backends: list[Backend], batches: int, x: np.ndarray) -> float:
    def work(backend: Backend) -> None:
        for _ in range(batches):
            backend.infer({"x": x})

    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with ThreadPoolExecutor(len(backends)) as pool:
            list(pool.map(work, backends))
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.gpu
def test_c_two_instances_on_one_gpu_overlap(runtime: str, tmp_path: Path) -> None:
    model_file = write_model(runtime, tmp_path, "chain", "chain", CHAIN_CONFIG[runtime] + GPU0, 8)
    config = load_pbtxt(model_file.parent.parent / "config.pbtxt")
    config.name = "chain"
    backends = [create_backend(config, model_file) for _ in range(2)]
    for backend in backends:
        backend.load(model_file, config, Device("gpu", 0))
    try:
        x = np.random.default_rng(1).standard_normal((8, CHAIN_WIDTH)).astype(np.float32)
        for backend in backends:
            got = backend.infer({"x": x})["y"]
            np.testing.assert_allclose(got, chain_reference(x), rtol=1e-2, atol=1e-2)
        alone = _seconds_for(backends[:1], 100, x)
        together = _seconds_for(backends, 100, x)
    finally:
        for backend in backends:
            backend.unload()
    # Serialised, two instances would take twice as long for twice the batches.
    assert together < 1.6 * alone, f"one instance {alone:.3f} s, two {together:.3f} s"


# (d) ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.anyio
async def test_d_instances_spread_over_every_gpu(runtime: str, tmp_path: Path) -> None:
    if gpu_count() < 2:
        pytest.skip(f"needs two GPUs; this machine has {gpu_count()}")
    every_gpu = "instance_group [{ kind: KIND_GPU count: 1 }]\n"
    write_model(runtime, tmp_path, "chain", "chain", every_gpu, 8)
    registry = _registry(tmp_path)
    await registry.load("chain")
    served = registry.get("chain")
    devices = sorted(str(m.device) for m in served.memory)
    x = np.random.default_rng(2).standard_normal((4, CHAIN_WIDTH)).astype(np.float32)
    answers = [
        (await instance.run(partial(instance.backend.infer, {"x": x})))["y"]
        for instance in served.batcher.pool.instances
    ]
    await registry.close()
    assert devices == [f"gpu:{i}" for i in range(gpu_count())]
    for got in answers:
        np.testing.assert_allclose(got, chain_reference(x), rtol=1e-2, atol=1e-2)


# (e) ---------------------------------------------------------------------------------------

_LOAD_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from batchserve.core.errors import BatchserveError
from batchserve.models.registry import ModelRegistry
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from batchserve.models.repository import ModelRepository
from batchserve.core.budgets import parse_budgets
from batchserve.scheduler.memory import MemoryBudgets
from batchserve.models.memory_probe import device_total_bytes

async def main() -> dict:
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(Path(sys.argv[1])), 8, budgets)
    try:
        await registry.load("chain")
    except BatchserveError as exc:
        return {"error": type(exc).__name__, "message": exc.message}
    devices = [str(m.device) for m in registry.get("chain").memory]
    await registry.close()
    return {"devices": devices}

print(json.dumps(asyncio.run(main())))
"""


def _load_elsewhere(repository: Path, **environment: str) -> dict[str, Any]:
    """Load the model in a fresh server process; what it answered, as JSON."""
    env = {**os.environ, **environment}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT, str(repository)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"the load script exited {done.returncode}: {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _fallback_cases(runtime: str, tmp_path: Path) -> tuple[Path, Path]:
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    gpu = "instance_group [{ kind: KIND_GPU count: 1 }]\n"
    write_model(runtime, strict, "chain", "chain", gpu, 8)
    write_model(
        runtime, lenient, "chain", "chain", gpu + "batchserve { allow_cpu_fallback: true }\n", 8
    )
    return strict, lenient


@pytest.mark.gpu
def test_e_with_cuda_hidden_a_gpu_model_runs_on_the_cpu_only_when_allowed(
    runtime: str, tmp_path: Path
) -> None:
    if runtime == "tensorrt":
        pytest.skip("tensorrt: an engine cannot run on the CPU, so there is nothing to fall to")
    _check_fallback_in_a_fresh_process(runtime, tmp_path)


def test_e_the_fresh_process_check_runs_where_the_suite_runs(tmp_path: Path) -> None:
    """test_e's own check, on this machine with CUDA hidden (or no GPU at all), so that the
    script it runs on a GPU machine cannot rot where no GPU ever runs it."""
    _check_fallback_in_a_fresh_process("onnxruntime", tmp_path)


def _check_fallback_in_a_fresh_process(runtime: str, tmp_path: Path) -> None:
    strict, lenient = _fallback_cases(runtime, tmp_path)
    refused = _load_elsewhere(strict, CUDA_VISIBLE_DEVICES="")
    assert refused["error"] == "DeviceUnavailable", refused
    assert "allow_cpu_fallback" in refused["message"]
    assert _load_elsewhere(lenient, CUDA_VISIBLE_DEVICES="") == {"devices": ["cpu"]}


@pytest.mark.parametrize("runtime", ["pytorch", "onnxruntime"])
@pytest.mark.anyio
async def test_e_without_a_gpu_a_gpu_model_fails_unless_fallback_is_allowed(
    runtime: str, tmp_path: Path
) -> None:
    """On a machine with no GPU at all, through the same registry path a server takes."""
    if gpu_count() > 0:
        pytest.skip("this machine has a GPU: test_e_with_cuda_hidden covers it")
    if runtime == "pytorch":
        pytest.importorskip("torch")
    strict, lenient = _fallback_cases(runtime, tmp_path)
    with pytest.raises(DeviceUnavailable, match=r"asks for a GPU.*allow_cpu_fallback"):
        await _served(strict, "chain")
    served = await _served(lenient, "chain")
    x = np.random.default_rng(3).standard_normal((2, CHAIN_WIDTH)).astype(np.float32)
    instance = served.batcher.pool.instances[0]
    got = (await instance.run(partial(instance.backend.infer, {"x": x})))["y"]
    await served.close()
    assert [str(m.device) for m in served.memory] == ["cpu"]
    np.testing.assert_allclose(got, chain_reference(x), rtol=1e-3, atol=1e-4)


# (f) ---------------------------------------------------------------------------------------

MEASURED_BOTH = re.compile(r"one sample at a time the CPU ran (\d+)/s, the GPU (\d+)/s")


@pytest.mark.gpu
@pytest.mark.anyio
async def test_f_left_to_the_server_a_model_is_timed_on_both_devices_and_split_by_it(
    runtime: str, tmp_path: Path
) -> None:
    """The load times one sample at a time on the CPU and on the GPU (transfers included).
    Where the CPU was the faster, one CPU instance joins the GPU ones and takes the batches
    under the crossover of the two instances' timed probe batches; either way every
    instance answers as the model computes."""
    if runtime == "tensorrt":
        pytest.skip("tensorrt: an engine runs on the GPU only, so there is no CPU to time")
    auto = "instance_group [{ kind: KIND_AUTO }]\ndynamic_batching { }\n"
    write_model(runtime, tmp_path, "chain", "chain", auto, 8)
    registry = _registry(tmp_path)
    await registry.load("chain")
    served = registry.get("chain")
    tuning, batcher = served.tuning, served.batcher
    assert tuning is not None, "no count and no threads: the load measures"
    timed = MEASURED_BOTH.search(tuning.reason)
    assert timed is not None, tuning.reason
    cpu_faster = int(timed[1]) > int(timed[2])
    instances = batcher.pool.instances
    on_cpu = [i for i in instances if i.backend.device.kind == "cpu"]
    on_gpu = [i for i in instances if i.backend.device.kind == "gpu"]
    assert len(on_gpu) == tuning.chosen.instances * gpu_count()  # a count is per GPU
    assert len(on_cpu) == tuning.chosen.cpu_instances == int(cpu_faster), tuning.reason
    shown = as_placed(served.config, [loaded.placement for loaded in served.instances])
    groups = [(g.kind, list(g.gpus)) for g in shown.instance_group]  # as a client reads it
    assert groups[0] == (ModelInstanceGroup.KIND_GPU, list(range(gpu_count())))
    assert groups[1:] == [(ModelInstanceGroup.KIND_CPU, [])] * int(cpu_faster)
    x = np.random.default_rng(3).standard_normal((4, CHAIN_WIDTH)).astype(np.float32)
    answers = [(await i.run(partial(i.backend.infer, {"x": x})))["y"] for i in instances]
    routing = batcher.routing
    if cpu_faster:
        cpu_times = batcher.batch_time(on_cpu[0].name)
        gpu_times = batcher.batch_time(on_gpu[0].name)
        assert cpu_times.known, "seeded by the probe's timed batches"
        assert gpu_times.known
        found = crossover(cpu_times, gpu_times, batcher.cap)
        assert routing.cpu_below == (found if found > 1 else 0)
        if routing.cpu_below:
            lone = routing.acquire(batcher.pool, 1)
            batcher.pool.release(lone)
            assert lone is on_cpu[0], "a batch of one goes to the CPU instance"
    else:
        assert routing.cpu_below == 0
    await registry.close()
    for got in answers:
        np.testing.assert_allclose(got, chain_reference(x), rtol=1e-2, atol=1e-2)
