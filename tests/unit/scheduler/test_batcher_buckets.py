"""Length-bucketed batches across instances and over time: a run of the cut is not split
while other runs are queued, and, like any batch, it waits for every answered client to come
back (the cut then chooses from more lengths)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend, ManualClock
from harness import answers, batcher_for, entered, request, submit

pytestmark = pytest.mark.anyio

US = 1_000


def _config(buckets: str = "", delay_us: int = 0) -> ModelConfig:
    return parse_pbtxt(f"""
        name: "seq" max_batch_size: 8
        input [{{ name: "x" data_type: TYPE_FP32 dims: [-1] }},
               {{ name: "lengths" data_type: TYPE_INT64 dims: [1] }}]
        output [{{ name: "y" data_type: TYPE_FP32 dims: [-1] }},
                {{ name: "total" data_type: TYPE_FP32 dims: [1] }}]
        dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
        batchserve {{ sequence_length_input: "lengths" length_buckets {{ {buckets} }} }}
    """)


def _sequence(length: int, clock: ManualClock | None = None) -> WorkItem:
    x = np.full((1, length), 1.0, np.float32)
    return request({"x": x, "lengths": np.array([[length]], np.int64)}, at=clock)


async def _one_pass(batcher: Batcher, lengths: list[int]) -> list[WorkItem]:
    """Requests decoded in one event-loop pass, answered."""
    items = [_sequence(length) for length in lengths]
    for one in items:
        batcher.submit(one)
    await answers(*items)
    return items


async def test_two_free_instances_take_two_runs_of_the_cut_whole() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = batcher_for(list(backends), _config())
    await _one_pass(batcher, [2, 30, 3, 29])
    # The cut is [2 3] [29 30]: each run on an instance of its own, neither split in two
    # (the halves would each pay a step's own cost again).
    assert sorted(shape for b in backends for shape in b.shapes) == [(2, 3), (2, 30)]


async def test_a_run_with_nothing_else_queued_is_still_split() -> None:
    backends = [FakeBackend(), FakeBackend()]
    batcher = batcher_for(list(backends), _config())
    await _one_pass(batcher, [5, 6])
    assert sorted(shape for b in backends for shape in b.shapes) == [(1, 5), (1, 6)]


async def _three_queued_one_out(buckets: str) -> tuple[Batcher, FakeBackend, WorkItem]:
    """Four closed-loop clients: the first runs (held), the other three queue behind it 10 us
    apart; then the first is answered and has not yet asked again."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = batcher_for([backend], _config(buckets, delay_us=1_000_000), clock)
    backend.gate.clear()
    first = _sequence(8, clock)
    await submit(batcher, first)  # an idle model: it goes at once
    await entered(backend)
    for _ in range(3):
        clock.advance(10 * US)
        await submit(batcher, _sequence(8, clock))
    backend.gate.set()
    await answers(first)
    await submit(batcher)  # the pass that dispatches after the answer
    return batcher, backend, first


@pytest.mark.parametrize("buckets", ["", "disabled: true"], ids=["bucketed", "padded"])
async def test_a_sequence_batch_waits_for_every_answered_client(buckets: str) -> None:
    batcher, backend, _ = await _three_queued_one_out(buckets)
    assert len(batcher.queue) == 3
    again = _sequence(8)
    await submit(batcher, again)  # the first client is back: all four go
    await answers(again)
    assert backend.batches == [1, 4]


@pytest.mark.parametrize("buckets", ["", "disabled: true"])
async def test_batches_hold_no_more_steps_than_the_memory_budget_allows(buckets: str) -> None:
    """Rows times the padded length stays within ``max_batch_steps``, with or without the
    cut; what fits still batches."""
    backend = FakeBackend()
    pool = InstancePool([Instance("fake-0", backend)])
    policy = BatchPolicy.from_config(_config(buckets), server_max_queue_size=64)
    batcher = Batcher(pool, replace(policy, max_batch_steps=60), ModelStats())
    await _one_pass(batcher, [30, 30, 30, 10, 10, 10, 10, 10, 10, 10])
    assert all(rows * length <= 60 for rows, length in backend.shapes)
    assert max(rows for rows, _ in backend.shapes) >= 2
    backend.shapes.clear()
    batcher.set_max_batch_size(8, 0)  # instances changed: the steps bound follows them
    await _one_pass(batcher, [30, 30, 30])
    assert backend.shapes == [(3, 30)]  # 90 steps: over the bound lifted, they batch whole


@pytest.mark.parametrize("buckets", ["", "disabled: true"], ids=["bucketed", "padded"])
async def test_a_batch_its_steps_cannot_grow_goes_without_waiting(buckets: str) -> None:
    """Under a queue delay, a batch waits for company only while company could join: three
    queued rows of 8 steps where a batch holds 16 make a full batch of two, which goes."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = batcher_for([backend], _config(buckets, delay_us=1_000_000), clock)
    batcher.set_max_batch_size(8, 16)
    backend.gate.clear()
    first = _sequence(8, clock)
    await submit(batcher, first)
    await entered(backend)
    queued = []
    for _ in range(3):
        clock.advance(10 * US)
        queued.append(_sequence(8, clock))
        await submit(batcher, queued[-1])
    backend.gate.set()
    await answers(first)
    await submit(batcher)  # the pass that dispatches after the answer
    await answers(*queued[:2])
    assert backend.batches == [1, 2]
    assert len(batcher.queue) == 1  # the third could still have company: it waits
