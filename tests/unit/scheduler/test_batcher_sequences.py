"""Variable-length sequences: grouped by length, padded, and cut back per request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend
from harness import answer, answers, batcher_for, entered, request
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.anyio

SEQUENCE_CONFIG = """
name: "seq"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [-1] },
       { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [-1] },
        { name: "total" data_type: TYPE_FP32 dims: [1] }]
dynamic_batching {}
"""


def _config(grouped: bool = True, max_batch_size: int = 4, buckets: str = "") -> ModelConfig:
    options = f'batchserve {{ sequence_length_input: "lengths" length_buckets {{ {buckets} }} }}'
    config = parse_pbtxt(SEQUENCE_CONFIG + (options if grouped else ""))
    config.max_batch_size = max_batch_size
    return config


def _sequence(length: int, value: float = 1.0) -> WorkItem:
    x = np.full((1, length), value, np.float32)
    return request({"x": x, "lengths": np.array([[length]], np.int64)})


async def _queue_behind_a_held_batch(
    batcher: Batcher, backend: FakeBackend, lengths: list[int]
) -> list[WorkItem]:
    backend.gate.clear()
    held = _sequence(1)
    batcher.submit(held)
    await entered(backend)
    items = [_sequence(length, float(i)) for i, length in enumerate(lengths)]
    for queued in items:
        batcher.submit(queued)
    backend.gate.set()
    await answers(held, *items)
    return items


MIXED = [length for pair in zip(range(2, 10), range(30, 22, -1), strict=True) for length in pair]


async def test_grouping_by_length_cuts_padding_waste() -> None:
    padding, executions = {}, {}
    for grouped, buckets in ((False, ""), (True, "disabled: true"), (True, "step_cost_rows: 1000")):
        backend = FakeBackend()
        batcher = batcher_for([backend], _config(grouped, buckets=buckets))
        await _queue_behind_a_held_batch(batcher, backend, MIXED)
        stats = batcher.stats
        padding[grouped, buckets] = (stats.padding_elements, stats.input_elements)
        executions[grouped, buckets] = stats.execution_count
        assert stats.inference_count == 1 + len(MIXED)
    # Without a sequence length input nothing could cut the outputs back, so requests of
    # different lengths never share a batch (Triton's rule): no padding, 17 runs of one.
    assert padding[False, ""] == (0, 2 + sum(MIXED) + 16)
    assert executions[False, ""] == 1 + len(MIXED)
    # Buckets off: queue order, [2 30 3 29] [4 28 5 27] ...: 176 padded elements.
    assert padding[True, "disabled: true"] == (176, 2 + 124 + 116 + 108 + 100)
    # A step worth 1000 rows: as few steps as the cap allows, so the cut is
    # [2 3 4 5] [6 7 8 9] [23 24 25 26] [27 28 29 30]: 6 padded elements each.
    assert padding[True, "step_cost_rows: 1000"] == (4 * 6, 2 + 20 + 120 + 36 + 104 + 16)
    assert executions[True, "step_cost_rows: 1000"] == 1 + 4


async def test_on_a_cpu_a_step_is_worth_a_row_and_the_cut_is_finer() -> None:
    backend = FakeBackend()
    batcher = batcher_for([backend], _config())
    await _queue_behind_a_held_batch(batcher, backend, MIXED)
    # The cheapest cut at a step's cost of one row (the CPU default before any is learned):
    # [2 3] [4 5 6] [7 8 9] [23 24 25 26] [27 28 29 30] (2*3 + 4*6 + 4*9 + 5*26 + 5*30 row
    # steps), each run going when its oldest request heads the queue: 19 padded elements.
    assert backend.shapes[1:] == [(2, 3), (4, 30), (3, 6), (4, 26), (3, 9)]
    assert batcher.stats.padding_elements == 1 + 3 + 6 + 6 + 3


async def test_each_request_gets_outputs_of_its_own_length() -> None:
    backend = FakeBackend()
    batcher = batcher_for([backend], _config())
    items = await _queue_behind_a_held_batch(batcher, backend, MIXED)
    for queued in items:
        out = queued.future.result()
        x = queued.inputs["x"]
        np.testing.assert_array_equal(out["y"], x * 2 + 1)  # cut back from the padded batch
        np.testing.assert_array_equal(out["total"], x.sum(axis=1, keepdims=True))


async def test_the_head_goes_first_then_the_closest_lengths() -> None:
    backend = FakeBackend()
    batcher = batcher_for([backend], _config(max_batch_size=3))
    await _queue_behind_a_held_batch(batcher, backend, [10, 50, 11, 49, 12])
    assert backend.shapes == [(1, 1), (3, 12), (2, 50)]


async def test_grouping_looks_only_a_bounded_way_ahead() -> None:
    backend = FakeBackend()
    batcher = batcher_for([backend], _config(max_batch_size=2, buckets="step_cost_rows: 1000"))
    await _queue_behind_a_held_batch(batcher, backend, [10, *[50] * 8, 11])
    assert backend.shapes[1] == (1, 10)  # the 11 is 9 places on: beyond 4 batches, unseen


async def test_grouping_leaves_the_rest_of_the_queue_in_order() -> None:
    backend = FakeBackend()
    batcher = batcher_for([backend], _config(max_batch_size=2))
    await _queue_behind_a_held_batch(batcher, backend, [10, 50, 11, 51, 90, 91])
    assert backend.shapes == [(1, 1), (2, 11), (2, 51), (2, 91)]


@pytest.fixture
def running_sum_model(tmp_path: Path) -> Path:
    """tokens[batch, seq], lengths[batch, 1] -> steps = cumsum(tokens) [batch, seq] and
    last = steps at each sample's true last position [batch, 1]: an RNN's two outputs."""
    nodes = [
        helper.make_node("CumSum", ["tokens", "axis"], ["steps"]),
        helper.make_node("Sub", ["lengths", "one"], ["last_index"]),
        helper.make_node("GatherElements", ["steps", "last_index"], ["last"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "running_sum",
        [
            helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq"]),
            helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("steps", TensorProto.FLOAT, ["batch", "seq"]),
            helper.make_tensor_value_info("last", TensorProto.FLOAT, ["batch", 1]),
        ],
        [
            numpy_helper.from_array(np.array(1, np.int64), "axis"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "running_sum.onnx"
    onnx.save(model, str(path))
    return path


async def test_a_real_sequence_model_answers_as_if_each_request_ran_alone(
    running_sum_model: Path,
) -> None:
    config = parse_pbtxt("""
        name: "running_sum" max_batch_size: 8
        input [{ name: "tokens" data_type: TYPE_FP32 dims: [-1] },
               { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
        output [{ name: "steps" data_type: TYPE_FP32 dims: [-1] },
                { name: "last" data_type: TYPE_FP32 dims: [1] }]
        dynamic_batching {}
        batchserve { sequence_length_input: "lengths" padding_value: 7
                     length_buckets { step_cost_rows: 1000 } }
    """)
    backend = OnnxBackend()
    backend.load(running_sum_model, config, CPU)
    batcher = batcher_for([backend], config)
    rng = np.random.default_rng(3)
    requests = [
        {
            "tokens": rng.standard_normal((rows, length)).astype(np.float32),
            "lengths": np.full((rows, 1), length, np.int64),
        }
        for rows, length in [(1, 1), (2, 7), (1, 3), (1, 12), (3, 5), (1, 2)]
    ]
    items = [request(inputs, outputs=("steps", "last")) for inputs in requests]
    for queued in items:  # the first runs alone, the other five share one padded batch
        batcher.submit(queued)
    for inputs, queued in zip(requests, items, strict=True):
        alone = backend.infer(inputs)
        out = await answer(queued)
        assert out["steps"].shape == inputs["tokens"].shape
        np.testing.assert_array_equal(out["steps"], alone["steps"])
        np.testing.assert_array_equal(out["last"], alone["last"])
    assert batcher.stats.execution_count == 2
    assert batcher.stats.padding_elements > 0
