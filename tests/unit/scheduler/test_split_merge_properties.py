"""Property: whatever batch a request shares, it gets exactly the answer it would get alone.

Checked at each level that holds the logic: merging and splitting arrays (``batching``),
cutting padded outputs back (``padding``), one batch's run with its out-of-memory and
poison recovery (``execution.BatchRun``), and the batcher end to end. The backends are
per-row functions, so "alone" is simply the backend run on the request's own arrays.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from batchserve.core.errors import BackendError, OutOfMemory
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.batching import merge_inputs, split_outputs
from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.padding import SequenceLayout
from batchserve.scheduler.work import Arrays, Outcome, WorkItem
from fakes import FakeBackend
from harness import batcher_for, entered, make_batcher, outcomes, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# Floats whose doubling and row sums stay finite: an overflow warning is an error here.
VALUES = st.floats(-(2.0**100), 2.0**100, width=32, allow_nan=False)
POISON = -1.0
OUTPUT_SETS = st.sampled_from([("y", "total"), ("y",), ("total",), ("total", "y")])
LAYOUT = SequenceLayout(inputs=(("x", 1),), outputs=(("y", 1),))
PROPERTY = settings(max_examples=60, deadline=None)
# The batcher runs batches on threads: fewer, slower examples.
END_TO_END = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def sequence_config(*, grouped: bool = True) -> ModelConfig:
    """A sequence model with room for 4 samples; ``grouped``: it names its length input,
    so requests are grouped by length, padded, and their outputs cut back."""
    return parse_pbtxt(
        """
        name: "seq" max_batch_size: 4
        input [{ name: "x" data_type: TYPE_FP32 dims: [-1] },
               { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [-1] },
                { name: "total" data_type: TYPE_FP32 dims: [1] }]
        dynamic_batching {}
        """
        + ('batchserve { sequence_length_input: "lengths" }' if grouped else "")
    )


# --- requests ----------------------------------------------------------------------------------


@st.composite
def fixed_requests(draw: st.DrawFn, max_rows: int = 5, max_count: int = 6) -> list[Arrays]:
    """Requests to the fake model: x[rows, 4], each with its own batch size."""
    count = draw(st.integers(1, max_count))
    sizes = draw(st.lists(st.integers(1, max_rows), min_size=count, max_size=count))
    return [
        {"x": draw(hnp.arrays(np.float32, (rows, 4), elements=VALUES.filter(_not_poison)))}
        for rows in sizes
    ]


def _not_poison(value: float) -> bool:
    return value != POISON


@st.composite
def sequence_requests(
    draw: st.DrawFn, max_rows: int = 3, max_count: int = 6, features: int | None = None
) -> list[Arrays]:
    """Requests to a sequence model: x[rows, length(, features)] of small integers (sums
    are then exact in float32) and each row's true length, at most the request's length."""
    count = draw(st.integers(1, max_count))
    requests = []
    for _ in range(count):
        rows, length = draw(st.integers(1, max_rows)), draw(st.integers(0, 9))
        shape = (rows, length) if features is None else (rows, length, features)
        x = draw(hnp.arrays(np.float32, shape, elements=st.integers(-1000, 1000)))
        true = draw(hnp.arrays(np.int64, (rows, 1), elements=st.integers(0, length)))
        requests.append({"x": x, "lengths": true})
    return requests


class LengthAwareBackend(FakeBackend):
    """A sequence model that reads its length input, as the padding contract requires:
    ``y = 2x + 1`` at every step (the padded steps are cut off afterwards) and ``total``,
    the sum of each row's true steps, so the padding value never shows in an answer."""

    def compute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x, lengths = inputs["x"], inputs["lengths"]
        steps = np.arange(x.shape[1]).reshape((1, -1) + (1,) * (x.ndim - 2))
        mask = steps < lengths.reshape((-1,) + (1,) * (x.ndim - 1))
        total = np.where(mask, x, 0).sum(axis=tuple(range(1, x.ndim)))
        return {"y": x * 2 + 1, "total": total.reshape(-1, 1).astype(np.float32)}

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        super().infer({"x": inputs["x"]}, ())  # the switches: gate, out of memory, poison
        outputs = self.compute(inputs)
        return {name: outputs[name] for name in (output_names or outputs)}


def alone(backend: FakeBackend, inputs: Arrays, names: Sequence[str] = ("y", "total")) -> Arrays:
    """What the model answers for this request run by itself (no fault switches)."""
    if isinstance(backend, LengthAwareBackend):
        outputs = backend.compute(inputs)
    else:
        x = inputs["x"]
        outputs = {"y": x * 2 + 1, "total": x.sum(axis=1, keepdims=True)}
    return {name: outputs[name] for name in names}


def assert_same(got: Arrays, want: Arrays) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


# --- merging and splitting arrays ---------------------------------------------------------------


@PROPERTY
@given(fixed_requests())
def test_merged_then_split_rows_are_each_requests_own(requests: list[Arrays]) -> None:
    merged = merge_inputs(requests)
    assert merged.padding == 0
    assert merged.elements == sum(r["x"].size for r in requests)
    outputs = FakeBackend().infer(merged.arrays)
    parts = split_outputs(outputs, [len(r["x"]) for r in requests])
    assert len(parts) == len(requests)
    for inputs, part in zip(requests, parts, strict=True):
        assert_same(part, alone(FakeBackend(), inputs))


@PROPERTY
@given(
    sequence_requests(features=None) | sequence_requests(features=2),
    st.sampled_from([0.0, 7.0, -3.5]),
)
def test_padded_merge_split_and_trim_give_each_request_its_own_answer(
    requests: list[Arrays], pad_value: float
) -> None:
    merged = merge_inputs(requests, pad_value)
    lengths = [LAYOUT.length(r) for r in requests]
    batch_length = max(lengths)
    x = merged.arrays["x"]
    assert x.shape[:2] == (sum(len(r["x"]) for r in requests), batch_length)
    per_step = math.prod(x.shape[2:])
    if len(requests) > 1:
        assert merged.padding == sum(
            len(r["x"]) * (batch_length - n) * per_step
            for r, n in zip(requests, lengths, strict=True)
        )
    backend = LengthAwareBackend()
    parts = split_outputs(backend.infer(merged.arrays), [len(r["x"]) for r in requests])
    for inputs, part, length in zip(requests, parts, lengths, strict=True):
        assert_same(LAYOUT.trim(part, length, batch_length), alone(backend, inputs))


# --- one batch's run, with its recoveries --------------------------------------------------------


def _items(
    requests: list[Arrays], names: list[tuple[str, ...]], layout: SequenceLayout
) -> list[WorkItem]:
    loop = asyncio.new_event_loop()  # a WorkItem needs a future; BatchRun never touches it
    try:
        items = []
        for inputs, wanted in zip(requests, names, strict=True):
            rows = len(inputs["x"])
            item = WorkItem(inputs, rows, wanted, 1, 0, None, loop.create_future())
            item.row_positions = layout.length(inputs) if layout else 0
            items.append(item)
        return items
    finally:
        loop.close()


def _check_outcomes(
    backend: FakeBackend,
    requests: list[Arrays],
    names: list[tuple[str, ...]],
    results: list[Outcome],
    oom_above: int | None,
    poisoned: int | None,
) -> None:
    for index, (inputs, wanted, outcome) in enumerate(zip(requests, names, results, strict=True)):
        if oom_above == 0:
            assert isinstance(outcome, OutOfMemory), outcome
            assert "does not fit in memory even alone" in outcome.message
        elif index == poisoned:
            assert isinstance(outcome, BackendError), outcome
            assert "poisoned" in outcome.message
        else:
            assert not isinstance(outcome, BaseException), outcome
            assert_same(outcome, alone(backend, inputs, wanted))


@PROPERTY
@given(
    fixed_requests(max_rows=6, max_count=8),
    st.data(),
    st.none() | st.integers(0, 10),
    st.booleans(),
)
def test_a_batch_run_answers_each_request_as_alone_through_out_of_memory_and_poison(
    requests: list[Arrays], data: st.DataObject, oom_above: int | None, poison: bool
) -> None:
    names = [data.draw(OUTPUT_SETS) for _ in requests]
    poisoned = data.draw(st.integers(0, len(requests) - 1)) if poison else None
    if poisoned is not None:
        requests[poisoned]["x"] = requests[poisoned]["x"].copy()
        requests[poisoned]["x"][-1, 0] = POISON
    backend = FakeBackend(oom_above=oom_above, poison=POISON)
    flat = SequenceLayout((), ())
    run = BatchRun(backend, _items(requests, names, flat), 0, flat)
    results = run()
    _check_outcomes(backend, requests, names, results, oom_above, poisoned)
    samples = sum(len(r["x"]) for r in requests)
    if oom_above is not None:
        assert all(size <= oom_above for size in backend.batches)
        assert (run.oom_splits > 0) == (samples > max(oom_above, 1))
        if run.oom_splits:
            assert run.largest_ok <= oom_above < run.smallest_oom
    if poisoned is None and oom_above != 0:
        assert sum(e.samples for e in run.executions) == samples  # each row ran once


@PROPERTY
@given(sequence_requests(max_rows=4), st.none() | st.integers(1, 6), st.sampled_from([0.0, 7.0]))
def test_a_padded_batch_run_answers_each_request_as_alone_through_out_of_memory(
    requests: list[Arrays], oom_above: int | None, pad_value: float
) -> None:
    names = [("y", "total")] * len(requests)
    backend = LengthAwareBackend(oom_above=oom_above)
    results = BatchRun(backend, _items(requests, names, LAYOUT), pad_value, LAYOUT)()
    _check_outcomes(backend, requests, names, results, oom_above, None)


# --- the batcher, end to end ---------------------------------------------------------------------


async def _through_batcher(
    batcher: Batcher, backend: FakeBackend, requests: list[Arrays], first: Arrays
) -> list[Outcome]:
    """Answers of ``requests`` queued behind ``first``, which holds the only instance, so
    they are formed into batches together once it is released."""
    try:
        backend.gate.clear()
        held = request(first)
        batcher.submit(held)
        await entered(backend)
        items = [request(inputs) for inputs in requests]
        for queued in items:
            batcher.submit(queued)
        backend.gate.set()
        return (await outcomes(held, *items))[1:]
    finally:
        backend.gate.set()
        await batcher.close()
        batcher.pool.close()


@pytest.mark.anyio
@END_TO_END
@given(fixed_requests(max_rows=4, max_count=10), st.none() | st.integers(1, 8))
async def test_the_batcher_answers_each_request_as_alone(
    requests: list[Arrays], oom_above: int | None
) -> None:
    backend = FakeBackend(oom_above=oom_above)
    batcher = make_batcher([backend])
    results = await _through_batcher(batcher, backend, requests, {"x": np.zeros((1, 4), "f4")})
    for inputs, outcome in zip(requests, results, strict=True):
        assert not isinstance(outcome, BaseException), outcome
        assert_same(outcome, alone(backend, inputs))
    assert max(backend.batches) <= min(oom_above or 8, 8)
    assert batcher.cap <= 8


@pytest.mark.anyio
@END_TO_END
@given(sequence_requests(max_rows=2, max_count=8), st.none() | st.integers(1, 4))
async def test_the_batcher_answers_each_sequence_request_as_alone(
    requests: list[Arrays], oom_above: int | None
) -> None:
    backend = LengthAwareBackend(oom_above=oom_above)
    batcher = batcher_for([backend], sequence_config())
    first = {"x": np.zeros((1, 1), "f4"), "lengths": np.ones((1, 1), "i8")}
    results = await _through_batcher(batcher, backend, requests, first)
    for inputs, outcome in zip(requests, results, strict=True):
        assert not isinstance(outcome, BaseException), outcome
        assert_same(outcome, alone(backend, inputs))


@pytest.mark.anyio
@END_TO_END
@given(sequence_requests(max_rows=2, max_count=8))
async def test_the_batcher_answers_each_request_of_an_unpadded_variable_shape_model_as_alone(
    requests: list[Arrays],
) -> None:
    backend = LengthAwareBackend()
    batcher = batcher_for([backend], sequence_config(grouped=False))
    first = {"x": np.zeros((1, 1), "f4"), "lengths": np.ones((1, 1), "i8")}
    results = await _through_batcher(batcher, backend, requests, first)
    for inputs, outcome in zip(requests, results, strict=True):
        assert not isinstance(outcome, BaseException), outcome
        assert_same(outcome, alone(backend, inputs))
