"""A batch formed while several CPU instances are free is split evenly across them; GPU
batches, batches fast enough for the event loop, batches whose measured time would hardly
shrink and batches with one free instance are not."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.device import Device
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.forming import split_evenly
from fakes import FakeBackend, fake_config
from harness import answer, answers, entered, inline_batcher, item

pytestmark = pytest.mark.anyio


def _split(sizes: list[int], parts: int) -> list[list[int]]:
    """``split_evenly`` on requests of these sample counts, as their sample counts."""
    groups = split_evenly([item(size, 1.0) for size in sizes], parts)  # items need a loop
    return [[entry.batch_size for entry in group] for group in groups]


async def test_equal_requests_split_into_equal_halves() -> None:
    assert _split([1, 1, 1, 1], 2) == [[1, 1], [1, 1]]
    assert _split([1, 1, 1, 1, 1], 2) == [[1, 1], [1, 1, 1]]


async def test_a_large_request_gets_a_run_of_its_own() -> None:
    assert _split([1, 3], 2) == [[1], [3]]
    assert _split([3, 1], 2) == [[3], [1]]
    assert _split([2, 1, 1], 2) == [[2], [1, 1]]


async def test_never_more_runs_than_requests_or_instances() -> None:
    assert _split([5], 2) == [[5]]
    assert _split([1, 1, 1], 4) == [[1], [1], [1]]


async def test_every_request_lands_once_in_order_and_no_run_is_empty() -> None:
    rng = random.Random(7)
    for _ in range(500):
        sizes = [rng.randint(1, 9) for _ in range(rng.randint(1, 12))]
        parts = rng.randint(1, 5)
        groups = _split(sizes, parts)
        assert [s for group in groups for s in group] == sizes
        assert all(groups)
        assert len(groups) <= min(parts, len(sizes))
        if parts >= 2 and len(sizes) >= 2 and max(sizes) <= sum(sizes) // parts:
            # with no request larger than a fair share, no run exceeds twice that share
            assert max(sum(g) for g in groups) <= 2 * sum(sizes) / min(parts, len(sizes))


def _batcher(backends: list[FakeBackend], *, inline: bool = False) -> Batcher:
    return inline_batcher(backends, inline=inline)


async def _burst(batcher: Batcher, size: int = 4) -> list[dict[str, np.ndarray]]:
    """``size`` requests of one sample submitted in one pass, answered."""
    burst = [item(1, float(i)) for i in range(size)]
    for request in burst:
        batcher.submit(request)
    return await answers(*burst)


async def test_a_burst_is_shared_by_two_free_cpu_instances() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = _batcher(backends)
    outputs = await _burst(batcher)
    assert [b.batches for b in backends] == [[2], [2]]
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out["y"], np.full((1, 4), 2 * i + 1))
    assert batcher.stats.execution_count == 2
    assert batcher.stats.inference_count == 4


async def test_gpu_instances_take_the_burst_as_one_batch() -> None:
    backends = [FakeBackend(), FakeBackend()]
    for backend in backends:
        backend.load(Path("model.onnx"), fake_config(""), Device("gpu", 0))
    batcher = _batcher(backends)
    burst = [item(1, float(i)) for i in range(4)]
    for request in burst:
        batcher.submit(request)
    await answers(*burst)
    assert sorted(b.batches for b in backends) == [[], [4]]


async def test_with_one_instance_busy_the_free_one_takes_everything() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = _batcher(backends)
    backends[0].gate.clear()
    first = item(1, 9.0)
    batcher.submit(first)
    await entered(backends[0])
    burst = [item(1, float(i)) for i in range(4)]
    for request in burst:
        batcher.submit(request)
    await answers(*burst)
    assert backends[1].batches == [4]
    backends[0].gate.set()
    await answer(first)
    assert backends[0].batches == [1]


class _ThreadNoting(FakeBackend):
    """The fake model, noting each batch's size and thread in a list its siblings share."""

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        super().__init__()
        self.runs = runs

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.runs.append((len(inputs["x"]), threading.get_ident()))
        return super().infer(inputs, output_names)


async def test_a_batch_fast_enough_for_the_loop_is_not_split() -> None:
    runs: list[tuple[int, int]] = []
    backends = [_ThreadNoting(runs), _ThreadNoting(runs)]
    batcher = _batcher(backends, inline=True)
    for _ in range(3):
        burst = [item(1, float(i)) for i in range(4)]
        for request in burst:
            batcher.submit(request)
        await answers(*burst)
    # unmeasured: split 2 + 2 on the threads; then halves of 2 are known to be fast, so the
    # four stay whole (measured on a thread), and the third burst runs whole on the loop
    loop = threading.get_ident()
    assert [size for size, _ in runs] == [2, 2, 4, 4]
    assert [thread == loop for _, thread in runs] == [False, False, False, True]


MS = 1_000_000


async def _burst_after_seeding(runs: list[tuple[int, int]]) -> list[list[int]]:
    """A burst of four to two free CPU instances whose batch times start from ``runs``."""
    backends = [FakeBackend(), FakeBackend()]
    batcher = _batcher(backends)
    for i in range(2):
        batcher.seed_batch_times(f"fake-{i}", runs)
    await _burst(batcher)
    return sorted(b.batches for b in backends)


async def test_a_batch_whose_time_is_fixed_is_not_split() -> None:
    """A model that waits rather than computes (Triton's identity backend with
    ``execute_delay_ms``): two halves would each take the whole batch's time."""
    assert await _burst_after_seeding([(1, 100 * MS), (4, 100 * MS)]) == [[], [4]]
    # mostly fixed: each half would take 5.7 of the whole's 7 ms
    assert await _burst_after_seeding([(1, 5 * MS), (4, 7 * MS)]) == [[], [4]]


async def test_a_batch_whose_time_grows_with_its_size_is_split() -> None:
    assert await _burst_after_seeding([(1, 1 * MS), (4, 4 * MS)]) == [[2], [2]]
    # a quarter saved, just: each half takes 3 of the whole's 4 ms
    assert await _burst_after_seeding([(1, 5 * MS // 2), (4, 4 * MS)]) == [[2], [2]]


async def test_several_instances_learn_their_batch_times_without_an_objective() -> None:
    """The split reads them: they must follow the instances' own runs, not only the load's."""
    batcher = _batcher([FakeBackend(), FakeBackend()])
    await _burst(batcher)
    assert batcher.batch_time("fake-0").known
    assert batcher.batch_time("fake-1").known
    alone = _batcher([FakeBackend()])
    lone = item(1, 1.0)
    alone.submit(lone)
    await answer(lone)
    assert not alone.batch_time("fake-0").known  # one instance: nothing reads them
