"""Images with free height and width batch within the pixels their memory budget holds:
equal shapes batch (Triton's rule), and a batch of large ones holds fewer rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from batchserve.core.device import CPU
from batchserve.core.errors import InvalidArgument
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.memory import DeviceBudget, MemoryProfile, StepBudget
from batchserve.scheduler.padding import check_steps, row_positions
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.work import Arrays, WorkItem
from fakes import FakeBackend, ManualClock
from harness import answers, batcher_for, entered, request, submit

pytestmark = pytest.mark.anyio
KIB, MIB = 1 << 10, 1 << 20


def _config(delay_us: int = 0) -> ModelConfig:
    return parse_pbtxt(f"""
        name: "cnn" max_batch_size: 8
        input [{{ name: "x" data_type: TYPE_FP32 dims: [-1, -1] }}]
        output [{{ name: "y" data_type: TYPE_FP32 dims: [-1, -1] }}]
        dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
    """)


def _image(side: int, clock: ManualClock | None = None) -> WorkItem:
    return request({"x": np.ones((1, side, side), np.float32)}, at=clock, outputs=("y",))


def test_the_policy_knows_each_input_s_free_axes() -> None:
    policy = BatchPolicy.from_config(_config(), server_max_queue_size=64)
    assert policy.position_inputs == (("x", (1, 2)),)
    assert policy.sequence_inputs == ()  # equal shapes batch; nothing is padded
    assert policy.max_batch_steps == 0  # until the memory budget says how many


async def test_batches_of_equal_images_hold_no_more_pixels_than_the_budget_allows() -> None:
    backend = FakeBackend()
    pool = InstancePool([Instance("fake-0", backend)])
    policy = BatchPolicy.from_config(_config(), server_max_queue_size=64)
    batcher = Batcher(pool, replace(policy, max_batch_steps=64), ModelStats())
    large = [_image(4) for _ in range(10)]  # 16 pixels: four to a batch
    for one in large:
        batcher.submit(one)
    outputs = await answers(*large)
    assert all(rows * h * w <= 64 for rows, h, w in backend.shapes)
    assert max(rows for rows, _, _ in backend.shapes) == 4
    assert all((out["y"] == 3).all() and out["y"].shape == (1, 4, 4) for out in outputs)
    backend.shapes.clear()
    small = [_image(2) for _ in range(10)]  # 4 pixels: the row cap binds first
    for one in small:
        batcher.submit(one)
    await answers(*small)
    assert max(rows for rows, _, _ in backend.shapes) == 8
    backend.shapes.clear()
    lone = _image(9)  # over the bound alone: admission refuses it first (padding.check_steps)
    await submit(batcher, lone)
    await answers(lone)
    assert backend.shapes == [(1, 9, 9)]


async def test_a_batch_of_images_its_pixels_cannot_grow_goes_without_waiting() -> None:
    """Under a 1 s queue delay, two queued 4x4 images fill a batch of 32 pixels: it goes."""
    clock, backend = ManualClock(), FakeBackend()
    batcher = batcher_for([backend], _config(delay_us=1_000_000), clock)
    batcher.set_max_batch_size(8, 32)
    backend.gate.clear()
    first = _image(4, clock)
    await submit(batcher, first)
    await entered(backend)
    queued = [_image(4, clock) for _ in range(3)]
    await submit(batcher, *queued)
    backend.gate.set()
    await answers(first)
    await submit(batcher)  # the pass that dispatches after the answer
    await answers(*queued[:2])
    assert backend.batches == [1, 2]
    assert len(batcher.queue) == 1


def test_an_image_over_the_pixels_a_batch_holds_is_refused_naming_the_tensor() -> None:
    policy = replace(BatchPolicy.from_config(_config(), 64), max_batch_steps=64)
    fits = {"x": np.zeros((4, 4, 4), np.float32)}
    assert row_positions(policy.position_inputs, fits) == 16
    check_steps(policy, "cnn", fits, 4)
    with pytest.raises(InvalidArgument) as refused:
        check_steps(policy, "cnn", {"x": np.zeros((1, 8, 9), np.float32)}, 1)
    assert refused.value.message == (
        "input 'x': 1 row(s) of 8 x 9 are 72 positions, more than a batch of model 'cnn' may "
        "hold (64 positions, derived from its memory budget); send smaller or fewer rows, or "
        "raise batchserve.max_batch_steps"
    )
    check_steps(replace(policy, max_batch_steps=0), "cnn", {"x": np.zeros((1, 80, 90))}, 1)


def _lent_pool(backend: FakeBackend, budget: DeviceBudget) -> InstancePool:
    """One instance reserving 64 positions (4 x 4 x 4) at 1 KiB each."""
    reservation = budget.reserve(
        "cnn", MemoryProfile(MIB, 16 * KIB), 8, steps=StepBudget(per_row=16, most=64)
    )
    return InstancePool([Instance("fake-0", backend, reservation)])


async def test_an_image_past_the_reservation_runs_alone_on_a_loan_then_released() -> None:
    backend, budget = FakeBackend(), DeviceBudget(CPU, 16 * MIB)
    pool = _lent_pool(backend, budget)
    policy = replace(BatchPolicy.from_config(_config(), 64), max_batch_steps=64)
    batcher = Batcher(pool, policy, ModelStats(), inline_below_ns=10**9)
    lent: list[int] = []
    infer = backend.infer

    def noting_the_loan(inputs: Arrays, names: Sequence[str] | None = None) -> dict[str, Any]:
        lent.append(budget.lent_bytes)
        return infer(inputs, names)

    backend.infer = noting_the_loan  # type: ignore[method-assign]
    check_steps(policy, "cnn", {"x": np.zeros((1, 9, 9), np.float32)}, 1, batcher.lenders())
    for side in (9, 9, 2):  # measured once, the 9 x 9 still never runs on the loop
        one = _image(side)
        batcher.submit(one)
        assert (await answers(one))[0]["y"].shape == (1, side, side)
    assert lent == [(81 - 64) * KIB, (81 - 64) * KIB, 0]
    assert budget.lent_bytes == 0
    assert getattr(backend, "released_after_runs", 0) == 2


def test_admission_refuses_what_the_budget_could_not_lend_saying_how_much() -> None:
    budget = DeviceBudget(CPU, 2 * MIB)
    pool = _lent_pool(FakeBackend(), budget)
    policy = replace(BatchPolicy.from_config(_config(), 64), max_batch_steps=64)
    lenders = [i.reservation for i in pool.instances if i.reservation is not None]
    unreserved = budget.unreserved()  # 2 MiB - 1 MiB - 64 KiB = 960 KiB
    check_steps(policy, "cnn", {"x": np.zeros((1, 32, 32), np.float32)}, 1, lenders)
    with pytest.raises(InvalidArgument) as refused:
        check_steps(policy, "cnn", {"x": np.zeros((1, 33, 33), np.float32)}, 1, lenders)
    assert unreserved == 960 * KIB
    assert refused.value.message == (
        "input 'x': 1 row(s) of 33 x 33 are 1089 positions, more than a batch of model 'cnn' "
        "may hold (64 positions, derived from its memory budget), and the 1.0 MiB more it "
        "needs is more than the cpu budget has unreserved (960 KiB); send smaller or fewer "
        "rows, or raise batchserve.max_batch_steps"
    )
