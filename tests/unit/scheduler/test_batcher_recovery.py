"""Out-of-memory recovery and poison isolation: no request fails because it shared a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.core.errors import BackendError, OutOfMemory
from batchserve.models.model_config import parse_pbtxt
from fakes import FakeBackend
from harness import (
    answer,
    answers,
    batcher_for,
    expected,
    hold_first,
    item,
    make_batcher,
    outcomes,
    request,
)
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.anyio


def _distinct(count: int, rows: int = 1) -> list[np.ndarray]:
    return [np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * i for i in range(count)]


async def test_out_of_memory_splits_the_batch_and_lowers_the_cap() -> None:
    backend = FakeBackend(oom_above=3)
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    inputs = _distinct(8)
    items = [request({"x": x}) for x in inputs]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answer(first)
    for x, queued in zip(inputs, items, strict=True):
        out = await answer(queued)
        np.testing.assert_array_equal(out["y"], expected(x)["y"])
        np.testing.assert_array_equal(out["total"], expected(x)["total"])
    assert backend.batches == [1, 2, 2, 2, 2]  # 8 and both 4s ran out of memory
    assert batcher.stats.oom_splits == 3
    assert batcher.stats.execution_count == 5
    assert batcher.stats.inference_count == 9
    assert batcher.cap == 2


async def test_later_batches_respect_the_lowered_cap() -> None:
    backend = FakeBackend(oom_above=3)
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    early = [item(1, 1.0) for _ in range(4)]
    for queued in early:
        batcher.submit(queued)
    backend.gate.set()
    await answers(first, *early)
    blocker = await hold_first(batcher, backend)
    later = [item(1, 2.0) for _ in range(5)]
    for queued in later:
        batcher.submit(queued)
    backend.gate.set()
    await answers(blocker, *later)
    assert batcher.cap == 2
    assert backend.batches == [1, 2, 2, 1, 2, 2, 1]
    assert batcher.stats.oom_splits == 1


async def test_a_lone_request_is_split_by_rows_and_joined_back() -> None:
    backend = FakeBackend(oom_above=2)
    batcher = make_batcher([backend])
    (x,) = _distinct(1, rows=7)
    lone = request({"x": x})
    batcher.submit(lone)
    out = await answer(lone)
    np.testing.assert_array_equal(out["y"], expected(x)["y"])
    np.testing.assert_array_equal(out["total"], expected(x)["total"])
    assert backend.batches == [1, 2, 2, 2]  # 7 -> 3 (-> 1 + 2) + 4 (-> 2 + 2)
    assert batcher.stats.oom_splits == 3
    assert batcher.cap == 2


async def test_a_request_that_does_not_fit_alone_says_so() -> None:
    backend = FakeBackend(oom_above=0)
    batcher = make_batcher([backend])
    lone = item(1, 1.0)
    batcher.submit(lone)
    with pytest.raises(OutOfMemory, match=r"batch of 1.*does not fit in memory even alone"):
        await answer(lone)
    assert batcher.cap == 8  # one sample failing is the request's size, not the batch's
    assert batcher.stats.oom_splits == 0


async def test_a_poisoned_request_fails_alone() -> None:
    backend = FakeBackend(poison=-1.0)
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    inputs = _distinct(8)
    inputs[5][0, 2] = -1.0
    items = [request({"x": x}) for x in inputs]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answer(first)
    results = await outcomes(*items)
    for i, (x, outcome) in enumerate(zip(inputs, results, strict=True)):
        if i == 5:
            assert isinstance(outcome, BackendError)
            assert "poisoned" in str(outcome)
        else:
            assert not isinstance(outcome, BaseException)
            np.testing.assert_array_equal(outcome["y"], expected(x)["y"])
    assert len(backend.batches) - 1 == 1 + 2 * 3  # the batch, then two halves per level
    assert batcher.cap == 8


async def test_bisection_is_bounded_when_every_run_fails() -> None:
    backend = FakeBackend(poison=-1.0)
    batcher = make_batcher([backend])
    first = await hold_first(batcher, backend)
    items = [item(1, -1.0) for _ in range(8)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answer(first)
    for queued in items:
        with pytest.raises(BackendError, match="poisoned"):
            await answer(queued)
    assert len(backend.batches) - 1 == 1 + 2 * 3
    ok = item(1, 2.0)
    batcher.submit(ok)
    assert (await answer(ok))["y"][0, 0] == 5.0


WIDE_W = np.full((64, 1024), 0.01, np.float32)


@pytest.fixture
def wide_model(tmp_path: Path) -> Path:
    """x[batch, 64] -> relu(x @ W)[batch, 1024]: 256 KiB of weights, 4 KiB out per sample."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024])],
        [numpy_helper.from_array(WIDE_W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "1" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    return path


async def test_real_onnx_runtime_out_of_memory_is_recovered(wide_model: Path) -> None:
    config = parse_pbtxt("""
        name: "wide" max_batch_size: 1024
        input [{ name: "x" data_type: TYPE_FP32 dims: [64] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [1024] }]
        dynamic_batching {}
    """)
    backend = OnnxBackend(memory_limit_bytes=2 << 20)  # 2 MiB arena: 256 rows do not fit
    backend.load(wide_model, config, CPU)
    batcher = batcher_for([backend], config)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(9)]
    items = [request({"x": x}, outputs=("y",)) for x in inputs]
    for queued in items:  # the first runs alone; the other 8 (256 rows) queue behind it
        batcher.submit(queued)
    for x, queued in zip(inputs, items, strict=True):
        out = await answer(queued)
        np.testing.assert_allclose(out["y"], np.maximum(x @ WIDE_W, 0), rtol=1e-5, atol=1e-6)
    assert batcher.stats.oom_splits >= 1
    assert 32 <= batcher.cap < 256
    assert batcher.stats.inference_count == 9 * 32
