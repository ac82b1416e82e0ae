"""BYTES through ONNX Runtime: the model must see the text, not Python's repr of bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.core.errors import InvalidArgument
from batchserve.models.model_config import parse_pbtxt
from onnx import TensorProto, helper
from onnx_models import write_model


@pytest.fixture
def backend(tmp_path: Path) -> OnnxBackend:
    """y = x + 1, with x and y strings that hold integers."""
    tensor = helper.make_tensor_value_info
    one = helper.make_tensor("one", TensorProto.INT32, [], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["n"], to=TensorProto.INT32),
            helper.make_node("Add", ["n", "one"], ["m"]),
            helper.make_node("Cast", ["m"], ["y"], to=TensorProto.STRING),
        ],
        "strings",
        [tensor("x", TensorProto.STRING, [None])],
        [tensor("y", TensorProto.STRING, [None])],
        [one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = write_model(tmp_path / "s" / "1" / "model.onnx", model)
    loaded = OnnxBackend()
    loaded.load(path, parse_pbtxt('name: "s"'), CPU)
    return loaded


def test_bytes_elements_reach_the_model_as_text(backend: OnnxBackend) -> None:
    out = backend.infer({"x": np.array([b"41", b"-2"], dtype=object)})
    assert [str(v) for v in out["y"]] == ["42", "-1"]


def test_str_and_fixed_width_bytes_arrays_work_too(backend: OnnxBackend) -> None:
    assert [str(v) for v in backend.infer({"x": np.array(["1"], dtype=object)})["y"]] == ["2"]
    assert [str(v) for v in backend.infer({"x": np.array([b"7"], dtype="S1")})["y"]] == ["8"]


def test_bytes_that_are_not_utf8_are_refused_naming_the_input(backend: OnnxBackend) -> None:
    with pytest.raises(InvalidArgument, match="input 'x' holds BYTES that are not UTF-8"):
        backend.infer({"x": np.array([b"\xff"], dtype=object)})
