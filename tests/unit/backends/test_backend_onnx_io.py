"""I/O binding over buffers sized once: the GPU path's logic, run on the CPU with host memory."""

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.onnx_io import (
    BatchPlan,
    BoundRunner,
    FixedRows,
    HostMemory,
    IoLayout,
    fixed_rows,
    plan_batch,
)
from batchserve.backends.onnx_session import session_signature
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.device import CPU
from batchserve.core.errors import InvalidArgument
from batchserve.core.signature import DYNAMIC, TensorSpec
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

Reference = Callable[[np.ndarray], dict[str, np.ndarray]]
FP32 = BY_WIRE["FP32"]


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def runner(path: Path, capacity: int, graph_sizes: tuple[int, ...] = ()) -> BoundRunner:
    loaded = session(path)
    layout = IoLayout.plan(session_signature(loaded, path), capacity)
    return BoundRunner(loaded, layout, HostMemory(), ort.RunOptions, graph_sizes)


def rows(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)


@pytest.mark.parametrize(
    ("shape", "datatype", "expected"),
    [
        ((DYNAMIC, 3, 4), "FP32", (3, 4)),
        ((DYNAMIC,), "INT64", ()),
        ((DYNAMIC, DYNAMIC, 4), "FP32", None),  # a sequence axis: sized per batch
        ((2, 3), "FP32", None),  # no batch axis
        ((DYNAMIC, 3), "BYTES", None),  # strings never go to a device buffer
        ((), "FP32", None),
    ],
)
def test_fixed_rows_only_where_a_buffer_can_be_sized_once(
    shape: tuple[int, ...], datatype: str, expected: tuple[int, ...] | None
) -> None:
    found = fixed_rows(TensorSpec("t", BY_WIRE[datatype], shape))
    assert (found.row_shape if found else None) == expected


def test_row_bytes_scale_with_the_batch() -> None:
    tensor = FixedRows("t", FP32, (3, 4))
    assert tensor.nbytes(5) == 5 * 3 * 4 * 4
    assert tensor.shape(5) == (5, 3, 4)


def test_layout_of_a_fully_fixed_model(mlp_file: Path) -> None:
    layout = IoLayout.plan(session_signature(session(mlp_file), mlp_file), 16)
    assert layout.capacity == 16
    assert list(layout.inputs) == ["x"]
    assert set(layout.outputs) == {"y", "hidden"}
    assert layout.complete


def test_layout_without_a_batch_axis_has_no_buffers(mlp_file: Path) -> None:
    layout = IoLayout.plan(session_signature(session(mlp_file), mlp_file), 0)
    assert (layout.inputs, layout.outputs, layout.complete) == ({}, {}, False)


def test_layout_of_a_sequence_model_buffers_the_output_only(sequence_file: Path) -> None:
    layout = IoLayout.plan(session_signature(session(sequence_file), sequence_file), 8)
    assert list(layout.inputs) == []
    assert list(layout.outputs) == ["pooled"]
    assert not layout.complete  # so no CUDA graphs for it


MLP_LAYOUT = IoLayout(
    16, {"x": FixedRows("x", FP32, (8,))}, {"y": FixedRows("y", FP32, (4,))}, True
)


@pytest.mark.parametrize(
    ("batch", "sizes", "expected"),
    [
        (3, (4, 8), BatchPlan(3, 4, 4, True)),  # padded up to the graph for 4
        (8, (4, 8), BatchPlan(8, 8, 8, True)),
        (9, (4, 8), BatchPlan(9, 9, None, True)),  # above the largest graph: no graph
        (3, (), BatchPlan(3, 3, None, True)),
        (17, (4, 8), BatchPlan(17, 17, None, False)),  # beyond the buffers: ORT allocates
    ],
)
def test_batch_plan_pads_to_graph_sizes_within_the_buffers(
    batch: int, sizes: tuple[int, ...], expected: BatchPlan
) -> None:
    assert plan_batch(MLP_LAYOUT, {"x": rows(batch)}, sizes) == expected


def test_no_graph_for_an_input_of_the_wrong_row_shape_or_an_incomplete_layout() -> None:
    odd = {"x": np.zeros((3, 7), np.float32)}
    assert plan_batch(MLP_LAYOUT, odd, (4,)).graph is None
    incomplete = IoLayout(16, MLP_LAYOUT.inputs, {}, False)
    assert plan_batch(incomplete, {"x": rows(3)}, (4,)).graph is None


def test_buffers_are_reused_and_results_are_the_callers(
    mlp_file: Path, mlp_reference: Reference
) -> None:
    bound = runner(mlp_file, capacity=16)
    first_x = rows(5, seed=1)
    first = bound.run({"x": first_x}, ["y", "hidden"])
    for batch, seed in ((16, 2), (1, 3), (5, 4), (5, 8)):  # a size again: its binding reused
        x = rows(batch, seed)
        y, hidden = bound.run({"x": x}, ["y", "hidden"])
        want = mlp_reference(x)
        np.testing.assert_allclose(y, want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hidden, want["hidden"], rtol=1e-5, atol=1e-6)
    # later batches overwrite the shared buffers, never what an earlier batch returned
    np.testing.assert_allclose(first[0], mlp_reference(first_x)["y"], rtol=1e-5, atol=1e-6)


def test_padding_up_to_a_graph_size_returns_only_the_batch(
    mlp_file: Path, mlp_reference: Reference
) -> None:
    bound = runner(mlp_file, capacity=16, graph_sizes=(4, 8))
    bound.capture_graphs()  # on the CPU ORT ignores gpu_graph_id; the runs must still work
    big = rows(8, seed=5)
    bound.run({"x": big}, ["y"])  # leaves 8 rows of other data in the buffers
    for batch in (3, 5, 11):
        x = rows(batch, seed=batch)
        (y,) = bound.run({"x": x}, ["y"])
        assert y.shape == (batch, 4)
        np.testing.assert_allclose(y, mlp_reference(x)["y"], rtol=1e-5, atol=1e-6)


def test_a_batch_beyond_the_buffers_still_runs(mlp_file: Path, mlp_reference: Reference) -> None:
    bound = runner(mlp_file, capacity=4)
    x = rows(9, seed=6)
    (hidden,) = bound.run({"x": x}, ["hidden"])
    np.testing.assert_allclose(hidden, mlp_reference(x)["hidden"], rtol=1e-5, atol=1e-6)


def test_only_the_requested_outputs_in_the_requested_order(mlp_file: Path) -> None:
    bound = runner(mlp_file, capacity=16)
    x = rows(2)
    hidden, y = bound.run({"x": x}, ["hidden", "y"])
    np.testing.assert_array_equal(y, np.maximum(hidden, 0))


def test_a_sequence_model_binds_inputs_per_batch_and_outputs_to_buffers(
    sequence_file: Path,
) -> None:
    bound = runner(sequence_file, capacity=8)
    for batch, seq in ((2, 3), (8, 11), (1, 1)):
        tokens = np.random.default_rng(seq).standard_normal((batch, seq, 4)).astype(np.float32)
        (pooled,) = bound.run({"tokens": tokens}, ["pooled"])
        np.testing.assert_allclose(pooled, tokens.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_backend_with_io_binding_and_a_batch_axis(mlp_file: Path, mlp_reference: Reference) -> None:
    backend = OnnxBackend(io_binding=True)
    backend.load(mlp_file, ModelConfig(name="m", max_batch_size=16), CPU)
    for batch in (1, 16, 3):
        x = rows(batch, seed=batch)
        out = backend.infer({"x": x})
        np.testing.assert_allclose(out["y"], mlp_reference(x)["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(
        InvalidArgument,
        match=r"model 'm': input 'x' has shape \[2, 7\], but the model takes \[-1, 8\]",
    ):
        backend.infer({"x": np.zeros((2, 7), np.float32)})
    backend.unload()
    backend.unload()


def test_cuda_graphs_asked_for_on_a_cpu_instance_are_ignored_with_a_warning(
    mlp_file: Path, mlp_reference: Reference, caplog: pytest.LogCaptureFixture
) -> None:
    config = text_format.Parse(
        "max_batch_size: 16 dynamic_batching { preferred_batch_size: [4, 8] } "
        "optimization { cuda { graphs: true } }",
        ModelConfig(name="m"),
    )
    backend = OnnxBackend()
    with caplog.at_level(logging.WARNING, logger="batchserve.backends.onnx"):
        backend.load(mlp_file, config, CPU)
    assert f"{mlp_file}: optimization.cuda.graphs is ignored on the CPU" in caplog.text
    assert backend.graph_batch_sizes == ()
    x = rows(3)
    np.testing.assert_allclose(
        backend.infer({"x": x})["y"], mlp_reference(x)["y"], rtol=1e-5, atol=1e-6
    )
