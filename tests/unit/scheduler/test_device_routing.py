"""A model with CPU and GPU instances: batches under the measured crossover run on the CPU,
the others on the GPU, and the crossover follows the instances' batch-time models."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.device import Device
from batchserve.models.model_config import parse_pbtxt
from batchserve.scheduler.batch_time import BatchTimeModel, crossover
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend, fake_config
from harness import answers, batcher_for, entered, item, make_batcher, request

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
    assert crossover(_model(CPU_TIMES), _model(GPU_TIMES), most=8) == 5
    assert crossover(_model(GPU_TIMES), _model(GPU_TIMES), most=8) == 1
    assert crossover(_model(CPU_TIMES), _model([(1, 9 * MS), (8, 16 * MS)]), most=8) == 9
    assert crossover(_model(CPU_TIMES), _model(GPU_TIMES), most=4) == 5, "past the most: none"
    assert crossover(BatchTimeModel(), _model(GPU_TIMES), most=8) == 0, "not measured: no split"


def test_a_crossover_in_positions_is_solved_not_searched() -> None:
    """In positions the sizes run to millions: the crossover is where the lines meet. CPU:
    1 ns a pixel; GPU: 4 ms to move and launch, then 0.01 ns a pixel: equal at 4.04 million."""
    cpu = _model([(100 * 100, 100 * 100), (2000 * 2000, 2000 * 2000)])
    gpu = _model([(100 * 100, 4 * MS + 100), (2000 * 2000, 4 * MS + 40_000)])
    found = crossover(cpu, gpu, most=1 << 40)
    assert found == math.ceil(4 * MS / 0.99) == 4_040_405
    assert gpu.predict(found) <= cpu.predict(found)
    assert gpu.predict(found - 10) > cpu.predict(found - 10)


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


IMAGE_CONFIG = """
    name: "cnn" max_batch_size: 8
    input [{ name: "x" data_type: TYPE_FP32 dims: [-1, -1] }]
    output [{ name: "y" data_type: TYPE_FP32 dims: [-1, -1] }]
    dynamic_batching { max_queue_delay_microseconds: 0 }
"""
US = 1_000
CPU_PIXELS = [(100, 100 * US), (10_000, 10 * MS)]  # 1 µs a pixel
GPU_PIXELS = [(100, 4 * MS + 10 * US), (10_000, 5 * MS)]  # 4 ms, then 0.1 µs a pixel
PIXELS_CROSSOVER = math.ceil(4 * MS / (900 * US / 1000))  # 4,445 pixels


def _image(side: int) -> WorkItem:
    return request({"x": np.ones((1, side, side), np.float32)}, outputs=("y",))


def _mixed_images(cpu: FakeBackend, gpu: FakeBackend) -> Batcher:
    config = parse_pbtxt(IMAGE_CONFIG)
    gpu.load(Path("model.onnx"), config, Device("gpu", 0))
    batcher = batcher_for([cpu, gpu], config)
    batcher.seed_batch_times("fake-0", CPU_PIXELS)
    batcher.seed_batch_times("fake-1", GPU_PIXELS)
    return batcher


async def test_a_model_with_free_axes_splits_by_pixels_not_by_rows() -> None:
    """Its batch times are in positions, so is its crossover: one large image goes to the
    GPU and a batch of four small ones to the CPU, where counted in rows it went the other
    way round."""
    cpu, gpu = FakeBackend(), FakeBackend()
    batcher = _mixed_images(cpu, gpu)
    assert batcher.routing.cpu_below == PIXELS_CROSSOVER == 4_445
    large = _image(80)  # 6,400 pixels
    batcher.submit(large)
    await answers(large)
    small = [_image(8) for _ in range(4)]  # 4 x 64 pixels, one batch
    for one in small:
        batcher.submit(one)
    await answers(*small)
    assert (cpu.shapes, gpu.shapes) == ([(4, 8, 8)], [(1, 80, 80)])


async def test_with_the_gpu_busy_the_cpu_takes_images_under_the_crossover_in_pixels() -> None:
    cpu, gpu = FakeBackend(), FakeBackend()
    batcher = _mixed_images(cpu, gpu)
    gpu.gate.clear()
    busy = _image(80)
    batcher.submit(busy)
    await entered(gpu)
    queued = [_image(32) for _ in range(6)]  # 1,024 pixels each: four make 4,096
    for one in queued:
        batcher.submit(one)
    await answers(*queued)
    assert [rows for rows, _, _ in cpu.shapes] == [4, 2]
    big = _image(70)  # 4,900 pixels alone: at the crossover, it waits for the GPU
    batcher.submit(big)
    await asyncio.sleep(0.05)
    assert len(batcher.queue) == 1
    gpu.gate.set()
    await answers(busy, big)
    assert gpu.shapes == [(1, 80, 80), (1, 70, 70)]
