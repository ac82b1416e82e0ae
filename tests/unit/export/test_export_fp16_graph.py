"""The FP16-typed ONNX graph an FP16 TensorRT engine is built from (no GPU needed to check it)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from batchserve.export.tensorrt import fp16_graph
from onnx import TensorProto

# The CNN the GPU-only engine test exports; this test checks the graph built from it.
SMALL_CNN = "test_export_tensorrt:SmallCNN"


@pytest.fixture
def fp32_onnx(export_cli: Callable[..., Any], repo: Path) -> Path:
    result = export_cli(SMALL_CNN, "--name", "cnn", "--input", "image:FP32:batch,3,16,16")
    assert result.code == 0, result.err
    return repo / "cnn" / "1" / "model.onnx"


def _elem_types(values: Any) -> set[int]:
    return {value.type.tensor_type.elem_type for value in values}


def test_weights_and_compute_are_fp16_while_inputs_and_outputs_stay_fp32(fp32_onnx: Path) -> None:
    converted = onnx.load(str(fp16_graph(fp32_onnx)))
    graph = converted.graph
    assert _elem_types(graph.input) == {TensorProto.FLOAT}
    assert _elem_types(graph.output) == {TensorProto.FLOAT}
    float_weights = {init.data_type for init in graph.initializer if init.data_type in (1, 10)}
    assert float_weights == {TensorProto.FLOAT16}
    casts = [node for node in graph.node if node.op_type == "Cast"]
    assert len(casts) >= 2  # into FP16 after the input, back to FP32 before the output
    onnx.checker.check_model(converted)


def test_the_fp16_graph_computes_what_the_fp32_graph_does_within_fp16_error(
    fp32_onnx: Path,
) -> None:
    image = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)

    def run(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, {session.get_inputs()[0].name: image})[0])

    reference, half = run(fp32_onnx), run(fp16_graph(fp32_onnx))
    assert half.dtype == np.float32
    spread = float(reference.max() - reference.min())
    np.testing.assert_allclose(half, reference, atol=1e-2 * spread, rtol=1e-2)
    assert not np.array_equal(half, reference)  # it really computed in FP16
