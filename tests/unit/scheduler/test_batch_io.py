"""Ragged batching (``batch_io.py``): batch inputs computed per request as Triton computes
them, ragged inputs sent flat, scattered outputs cut by each request's shape; and batches of
a real ONNX model of that kind, formed and recovered by the batcher.

The expected batch inputs are those Triton's own ragged-batching QA asserts
(``qa/L0_batch_input/batch_input_test.py``) for the same request shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.core.errors import OutOfMemory
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batch_io import BatchIO, model_feed
from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.padding import SequenceLayout
from batchserve.scheduler.work import Arrays
from harness import answers, batcher_for, request

from tests.ragged_models import (
    ITEM_AREAS_CONFIG,
    RAGGED_SUMS_CONFIG,
    item_areas_model,
    ragged_sums_model,
)

pytestmark = pytest.mark.anyio

QA_LENGTHS = (2, 4, 1, 3)
"""Triton's QA requests: RAGGED_INPUT of shapes [1, 2], [1, 4], [1, 1], [1, 3]."""


def _config(kind: str, *, dims: str = "[ -1 ]", batch_output: str = "") -> ModelConfig:
    return parse_pbtxt(f"""
        name: "m" max_batch_size: 8
        input [{{ name: "RAGGED" data_type: TYPE_FP32 dims: {dims} allow_ragged_batch: true }}]
        output [{{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}]
        batch_input [{{ kind: {kind} target_name: "B" data_type: TYPE_FP32
                       source_input: "RAGGED" }}]
        {batch_output}
    """)


def _requests(shapes: Sequence[tuple[int, ...]]) -> list[Arrays]:
    return [
        {"RAGGED": np.full(shape, shape[0] * 10 + i, np.float32)} for i, shape in enumerate(shapes)
    ]


def _batch_io(config: ModelConfig) -> BatchIO:
    batch_io = BatchIO.from_config(config)
    assert batch_io is not None
    return batch_io


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", [2, 4, 1, 3]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [2, 6, 7, 10]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 2, 6, 7, 10]),
    ],
)
def test_element_counts_are_computed_per_request_in_batch_order(
    kind: str, expected: list[int]
) -> None:
    merged = _batch_io(_config(kind)).merge(_requests([(1, n) for n in QA_LENGTHS]))
    assert merged.arrays["B"].dtype == np.float32
    assert merged.arrays["B"].tolist() == expected


def test_the_largest_element_count_is_given_as_a_shape() -> None:
    merged = _batch_io(_config("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE")).merge(
        _requests([(1, n) for n in QA_LENGTHS])
    )
    assert merged.arrays["B"].shape == (4,)


def test_a_request_of_several_rows_counts_as_one_request() -> None:
    """Triton counts requests, not rows: a [2, 3] request has 6 elements."""
    merged = _batch_io(_config("BATCH_ELEMENT_COUNT")).merge(_requests([(2, 3), (1, 5)]))
    assert merged.arrays["B"].tolist() == [6, 5]


def test_item_shapes_give_a_row_per_batch_row() -> None:
    """Triton's test_batch_item_shape: [2, 1, 2], [1, 1, 2], [1, 2, 2]."""
    shapes = [(2, 1, 2), (1, 1, 2), (1, 2, 2)]
    config = _config("BATCH_ITEM_SHAPE", dims="[ -1, -1 ]")
    merged = _batch_io(config).merge(_requests(shapes))
    assert merged.arrays["B"].tolist() == [[1, 2], [1, 2], [1, 2], [2, 2]]
    flatten = _config("BATCH_ITEM_SHAPE_FLATTEN", dims="[ -1, -1 ]")
    merged = _batch_io(flatten).merge(_requests([(1, 4, 1), (1, 1, 2), (1, 1, 2), (1, 2, 2)]))
    assert merged.arrays["B"].tolist() == [4, 1, 1, 2, 1, 2, 2, 2]  # Triton's flatten test


def test_ragged_inputs_reach_the_model_flat_in_request_order() -> None:
    requests = _requests([(1, n) for n in QA_LENGTHS])
    merged = _batch_io(_config("BATCH_ELEMENT_COUNT")).merge(requests)
    expected = np.concatenate([r["RAGGED"].reshape(-1) for r in requests])
    np.testing.assert_array_equal(merged.arrays["RAGGED"], expected)
    assert merged.padding == 0
    assert merged.elements == 10


def test_scattered_outputs_take_each_requests_own_shape() -> None:
    """Triton's ragged_io: an identity model whose flat output goes back as each input."""
    scatter = (
        'batch_output [{ target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
        'source_input: "RAGGED" }]'
    )
    batch_io = _batch_io(_config("BATCH_ELEMENT_COUNT", batch_output=scatter))
    requests = _requests([(1, 2), (2, 3), (1, 1)])
    merged = batch_io.merge(requests)
    outputs = {"OUT": merged.arrays["RAGGED"] * 2, "COUNT": np.arange(4).reshape(4, 1)}
    parts = batch_io.split(outputs, requests, [1, 2, 1])
    for part, sent in zip(parts, requests, strict=True):
        np.testing.assert_array_equal(part["OUT"], sent["RAGGED"] * 2)
    assert [part["COUNT"].ravel().tolist() for part in parts] == [[0], [1, 2], [3]]


def test_a_stacked_warm_up_batch_is_fed_as_requests_of_one_row() -> None:
    config = _config("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO")
    fed = model_feed(config, {"RAGGED": np.zeros((3, 5), np.float32)})
    assert fed["RAGGED"].shape == (15,)
    assert fed["B"].tolist() == [0, 5, 10, 15]
    plain = parse_pbtxt('name: "p" max_batch_size: 8 input [{ name: "x" dims: [ 2 ] }]')
    batch = {"x": np.zeros((3, 2), np.float32)}
    assert model_feed(plain, batch) is batch  # nothing to do without ragged batching


def _backend(tmp_path: Path, model: onnx.ModelProto, config: ModelConfig) -> OnnxBackend:
    path = tmp_path / config.name / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
    backend = OnnxBackend()
    backend.load(path, config, CPU)
    return backend


async def test_requests_of_different_lengths_share_a_batch_and_each_gets_its_own_sum(
    tmp_path: Path,
) -> None:
    config = parse_pbtxt(RAGGED_SUMS_CONFIG)
    backend = _backend(tmp_path, ragged_sums_model(), config)
    batcher = batcher_for([backend], config)
    lengths = [3, 2, 4, 1, 3, 2, 5]
    values = [
        np.arange(1, n + 1, dtype=np.float32).reshape(1, n) * (i + 1) for i, n in enumerate(lengths)
    ]
    items = [request({"VALUES": v}, outputs=("SUM", "ECHO", "COUNTS")) for v in values]
    for queued in items:  # queued in one pass: they batch
        batcher.submit(queued)
    results = await answers(*items)
    for sent, result in zip(values, results, strict=True):
        assert result["SUM"].tolist() == [[float(sent.sum())]]
        np.testing.assert_array_equal(result["ECHO"], sent)
    batches = list(dict.fromkeys(tuple(result["COUNTS"].ravel()) for result in results))
    assert [n for counts in batches for n in counts] == lengths  # each batch's, in order
    assert batcher.stats.execution_count == len(batches) < len(lengths)


async def test_item_shapes_reach_the_model_row_by_row(tmp_path: Path) -> None:
    config = parse_pbtxt(ITEM_AREAS_CONFIG)
    backend = _backend(tmp_path, item_areas_model(), config)
    batcher = batcher_for([backend], config)
    shapes = [(1, 1, 1), (2, 3, 2), (1, 4, 5), (3, 1, 7)]
    items = [
        request({"GRID": np.zeros(shape, np.float32)}, outputs=("AREA", "FLAT_AREA"))
        for shape in shapes
    ]
    for queued in items:
        batcher.submit(queued)
    for shape, result in zip(shapes, await answers(*items), strict=True):
        expected = [[float(shape[1] * shape[2])]] * shape[0]
        assert result["AREA"].tolist() == expected
        assert result["FLAT_AREA"].tolist() == expected


class _FlatLimit:
    """A model that runs out of memory past ``limit`` flat elements, and records its runs."""

    device = CPU

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.runs: list[list[float]] = []

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        counts = inputs["B"]
        self.runs.append(counts.tolist())
        if inputs["RAGGED"].size > self.limit:
            raise OutOfMemory("no room")
        return {"OUT": np.repeat(counts.reshape(1, -1), len(counts), axis=0)}

    def interrupt(self) -> None:
        """Nothing to stop."""

    def release_after_next_run(self) -> None:
        """Nothing to give back."""


async def test_out_of_memory_splits_by_requests_never_rows(tmp_path: Path) -> None:
    """Halving by requests keeps each request's count; a lone request is never cut into
    rows, which would change what the model is told about it."""
    backend = _FlatLimit(limit=8)
    config = _config("BATCH_ELEMENT_COUNT")
    batch_io = _batch_io(config)
    items = [request({"RAGGED": np.ones((1, 4), np.float32)}, outputs=("OUT",)) for _ in range(4)]
    items.append(request({"RAGGED": np.ones((3, 4), np.float32)}, outputs=("OUT",)))
    run = BatchRun(backend, items, 0.0, SequenceLayout((), ()), batch_io=batch_io)  # type: ignore[arg-type]
    outcomes = run()
    for outcome in outcomes[:4]:
        assert isinstance(outcome, dict)
        assert set(outcome["OUT"].ravel().tolist()) == {4.0}
    assert isinstance(outcomes[4], OutOfMemory)
    assert "does not fit in memory even alone" in outcomes[4].message
    assert [12.0] in backend.runs  # the lone request ran whole
    assert {count for counts in backend.runs for count in counts} == {4.0, 12.0}  # never rows
