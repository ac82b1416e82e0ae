"""A model with CPU and GPU instances: batches under the measured crossover run on the CPU,
the others on the GPU, and the crossover follows the instances' batch-time models."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from batchserve.core.device import Device
from batchserve.scheduler.batch_time import BatchTimeModel, crossover
from batchserve.scheduler.batcher import Batcher
from fakes import FakeBackend, fake_config
from harness import answers, entered, item, make_batcher

pytestmark = pytest.mark.anyio

MS = 1_000_000


def _model(runs: list[tuple[int, int]]) -> BatchTimeModel:
    model = BatchTimeModel()
    for samples, ns in runs:
        model.record(samples, ns)
    return model


CPU_TIMES = [(1, 1 * MS), (8, 8 * MS)]  # 1 ms a sample, nothing fixed
GPU_TIMES = [(1, 4 * MS), (8, 4 * MS + 7 * MS // 10)]  # 4 ms to move and launch, 0.1 ms a sample


def test_the_crossover_is_the_smallest_batch_the_gpu_runs_no_slower() -> None:
    # CPU: n ms; GPU: 3.9 + 0.1 n ms; equal at n = 4.33: from 5 samples on, the GPU wins.
    assert crossover(_model(CPU_TIMES), _model(GPU_TIMES), cap=8) == 5
    assert crossover(_model(GPU_TIMES), _model(GPU_TIMES), cap=8) == 1
    assert crossover(_model(CPU_TIMES), _model([(1, 9 * MS), (8, 16 * MS)]), cap=8) == 9
    assert crossover(BatchTimeModel(), _model(GPU_TIMES), cap=8) == 0, "not measured: no split"


def _mixed(cpu: FakeBackend, gpu: FakeBackend) -> Batcher:
    gpu.load(Path("model.onnx"), fake_config(""), Device("gpu", 0))
    batcher = make_batcher([cpu, gpu], "dynamic_batching { max_queue_delay_microseconds: 0 }")
    batcher.seed_batch_times("fake-0", CPU_TIMES)
    batcher.seed_batch_times("fake-1", GPU_TIMES)
    return batcher


async def test_small_batches_run_on_the_cpu_and_large_ones_on_the_gpu() -> None:
    cpu, gpu = FakeBackend(), FakeBackend()
    batcher = _mixed(cpu, gpu)
    assert batcher.routing.cpu_below == 5
    small = item(2, 1.0)
    batcher.submit(small)
    await answers(small)
    large = item(6, 2.0)
    batcher.submit(large)
    await answers(large)
    assert (cpu.batches, gpu.batches) == ([2], [6])


async def test_with_the_gpu_busy_the_cpu_takes_only_batches_under_the_crossover() -> None:
    cpu, gpu = FakeBackend(), FakeBackend()
    batcher = _mixed(cpu, gpu)
    gpu.gate.clear()
    busy = item(6, 1.0)
    batcher.submit(busy)
    await entered(gpu)
    queued = [item(1, float(n)) for n in range(6)]  # six samples: one batch would cross
    for one in queued:
        batcher.submit(one)
    await answers(*queued)
    assert cpu.batches == [4, 2], "four (under the crossover of five), then the other two"
    big = item(5, 9.0)
    batcher.submit(big)
    await asyncio.sleep(0.05)
    assert len(batcher.queue) == 1, "a request at the crossover waits for the GPU"
    assert cpu.batches == [4, 2]
    gpu.gate.set()
    await answers(busy, big)
    assert gpu.batches == [6, 5]


async def test_instances_all_on_one_device_are_not_split_or_timed() -> None:
    one, two = FakeBackend(), FakeBackend()
    batcher = make_batcher([one, two])
    batcher.seed_batch_times("fake-0", CPU_TIMES)
    batcher.seed_batch_times("fake-1", CPU_TIMES)
    assert (batcher.routing.cpu_below, batcher.routing.mixed) == (0, False)


async def test_the_crossover_is_learned_again_from_the_batches_run() -> None:
    cpu, gpu = FakeBackend(), FakeBackend()
    batcher = _mixed(cpu, gpu)
    model = batcher.batch_time("fake-1")
    for _ in range(200):  # the GPU turns out to be fast at every size
        model.record(1, MS // 10)
        model.record(8, MS // 5)
    for n in range(16):  # sixteen recorded batches bring the crossover up to date
        one = item(6, float(n))
        batcher.submit(one)
        await answers(one)
    assert batcher.routing.cpu_below == 0
