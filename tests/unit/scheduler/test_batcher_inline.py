"""Fast CPU batches run on the event loop; slow, unmeasured and GPU batches on the thread;
the server dispatches once per event-loop pass so that such batches still grow with load."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from batchserve.core.device import Device
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.inline import InlineRuns
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from fakes import FakeBackend
from harness import ONE_SECOND_NS, answer, answers, inline_batcher, item
from harness import request as image_request

pytestmark = pytest.mark.anyio


def test_unmeasured_sizes_go_to_the_thread() -> None:
    runs = InlineRuns(threshold_ns=100)
    assert not runs.inline(1)
    runs.record(1, 50)
    assert runs.inline(1)
    assert not runs.inline(2)


def test_the_decision_follows_the_smoothed_run_time() -> None:
    runs = InlineRuns(threshold_ns=100)
    runs.record(4, 40)
    assert runs.inline(4)
    runs.record(4, 1_000)  # one slow run: 40 + (1000 - 40) / 4 = 280
    assert not runs.inline(4)
    for _ in range(8):
        runs.record(4, 40)
    assert runs.inline(4)


def test_rows_of_another_size_are_measured_apart() -> None:
    """A model with free axes: rows of 16 positions measured fast say nothing of rows of a
    million; within a power of two they share a measurement."""
    runs = InlineRuns(threshold_ns=100)
    runs.record(1, 50, row_positions=16)
    assert runs.inline(1, row_positions=16)
    assert runs.inline(1, row_positions=31)
    assert not runs.inline(1, row_positions=32)
    assert not runs.inline(1, row_positions=1024 * 1024)
    assert not runs.inline(1)  # a model counted in rows is its own


def test_disabled_never_runs_inline() -> None:
    runs = InlineRuns(threshold_ns=0)
    runs.record(1, 1)
    assert not runs.inline(1)


class ThreadRecordingBackend(FakeBackend):
    """The fake model, noting which thread each batch ran on."""

    def __init__(self, device: Device | None = None) -> None:
        super().__init__()
        self.threads: list[int] = []
        if device is not None:
            self._device = device

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        return super().infer(inputs, output_names)


def _batcher(backend: FakeBackend, inline: bool) -> Batcher:
    return inline_batcher([backend], inline=inline)


async def test_a_measured_fast_cpu_batch_runs_on_the_loop_thread() -> None:
    backend = ThreadRecordingBackend()
    batcher = _batcher(backend, inline=True)
    loop_thread = threading.get_ident()
    for value in (1.0, 2.0, 3.0):
        request = item(1, value)
        batcher.submit(request)
        out = await answer(request)
        np.testing.assert_array_equal(out["y"], np.full((1, 4), 2 * value + 1))
    first, *later = backend.threads
    assert first != loop_thread  # unmeasured: the instance's thread
    assert later == [loop_thread, loop_thread]
    assert batcher.stats.execution_count == 3


async def test_gpu_instances_and_the_default_keep_to_their_thread() -> None:
    loop_thread = threading.get_ident()
    for backend, inline in (
        (ThreadRecordingBackend(Device("gpu", 0)), True),
        (ThreadRecordingBackend(), False),
    ):
        batcher = _batcher(backend, inline)
        for _ in range(3):
            request = item(1, 1.0)
            batcher.submit(request)
            await answer(request)
        assert loop_thread not in backend.threads


async def test_an_inline_failure_reaches_only_the_waiters() -> None:
    backend = ThreadRecordingBackend()
    batcher = _batcher(backend, inline=True)
    warm = item(1, 1.0)
    batcher.submit(warm)
    await answer(warm)
    backend.poison = 7.0
    poisoned = item(1, 7.0)
    batcher.submit(poisoned)
    with pytest.raises(Exception, match="poisoned input"):
        await answer(poisoned)
    healthy = item(1, 2.0)
    batcher.submit(healthy)
    np.testing.assert_array_equal((await answer(healthy))["y"], np.full((1, 4), 5.0))
    assert threading.get_ident() in backend.threads


async def test_requests_queued_in_one_loop_pass_form_one_inline_batch() -> None:
    backend = ThreadRecordingBackend()
    batcher = _batcher(backend, inline=True)
    for size in (1, 8):  # measure both sizes on the thread first
        warm = [item(1, 1.0) for _ in range(size)]
        for request in warm:
            batcher.submit(request)
        await answers(*warm)
    assert backend.batches == [1, 8]
    loop_thread = threading.get_ident()
    burst = [item(1, float(i)) for i in range(8)]
    for request in burst:
        batcher.submit(request)
    assert batcher.pool.busy_count() == 0  # nothing starts before the pass ends
    assert len(batcher.queue) == 8
    outputs = await answers(*burst)
    assert backend.batches == [1, 8, 8]  # one batch of eight, not eight of one
    assert backend.threads[-1] == loop_thread
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out["y"], np.full((1, 4), 2 * i + 1))


async def test_a_large_image_does_not_run_on_the_loop_where_small_ones_did() -> None:
    """Measured fast on 4 x 4 images, the batch of one 64 x 64 image still goes to the
    thread: inline, a 1024 x 1024 one held the event loop for 300 ms."""
    backend = ThreadRecordingBackend()
    config = parse_pbtxt("""
        name: "cnn" max_batch_size: 8
        input [{ name: "x" data_type: TYPE_FP32 dims: [-1, -1] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [-1, -1] }]
        dynamic_batching {}
    """)
    pool = InstancePool([Instance("fake-0", backend)])
    policy = BatchPolicy.from_config(config, server_max_queue_size=64)
    batcher = Batcher(pool, policy, ModelStats(), inline_below_ns=ONE_SECOND_NS)
    loop_thread = threading.get_ident()
    for side in (4, 4, 4, 64):
        one = image_request({"x": np.ones((1, side, side), np.float32)}, outputs=("y",))
        batcher.submit(one)
        await answer(one)
    assert backend.threads[1:3] == [loop_thread, loop_thread]
    assert backend.threads[3] != loop_thread
