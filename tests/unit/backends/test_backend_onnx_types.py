"""One table of ONNX element types: the file and ONNX Runtime's session read the same type."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.onnx_session import session_signature
from batchserve.backends.onnx_types import datatype_from_onnx, datatype_from_ort
from batchserve.core.errors import ModelConfigError
from onnx import TensorProto, helper

SUPPORTED = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
    "INT8": "INT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "FLOAT16": "FP16",
    "FLOAT": "FP32",
    "DOUBLE": "FP64",
    "STRING": "BYTES",
    "BFLOAT16": "BF16",
}


@pytest.mark.parametrize(("onnx_type", "wire"), SUPPORTED.items())
def test_the_file_and_the_session_agree_on_every_supported_type(
    onnx_type: str, wire: str, tmp_path: Path, build_onnx: Callable[..., Path]
) -> None:
    element = getattr(TensorProto, onnx_type)
    path = build_onnx(
        tmp_path / "identity.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [("x", element, ["batch", 2])],
        [("y", element, ["batch", 2])],
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    from_file = read_onnx_signature(path).inputs[0].datatype
    from_session = session_signature(session, path).inputs[0].datatype
    assert from_file is from_session
    assert from_file.wire == wire


@pytest.mark.parametrize("onnx_type", ["COMPLEX64", "FLOAT8E4M3FN", "UNDEFINED"])
def test_types_batchserve_cannot_carry_are_refused(onnx_type: str) -> None:
    assert datatype_from_onnx(onnx_type) is None
    assert datatype_from_ort(f"tensor({onnx_type.lower()})") is None


def test_sequences_and_maps_from_a_session_are_refused() -> None:
    assert datatype_from_ort("seq(tensor(float))") is None
    assert datatype_from_ort("map(int64,tensor(float))") is None


def test_an_unsupported_type_in_the_file_names_the_tensor_and_type(
    tmp_path: Path, build_onnx: Callable[..., Path]
) -> None:
    path = build_onnx(
        tmp_path / "complex.onnx",
        [helper.make_node("Identity", ["z"], ["w"])],
        [("z", TensorProto.COMPLEX64, [2])],
        [("w", TensorProto.COMPLEX64, [2])],
    )
    with pytest.raises(ModelConfigError, match="tensor 'z' has unsupported type COMPLEX64"):
        read_onnx_signature(path)


@pytest.mark.parametrize(
    ("value_type", "shown", "hinted"),
    [
        (
            helper.make_sequence_type_proto(
                helper.make_map_type_proto(
                    TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)
                )
            ),
            "seq(map(int64,tensor(float)))",
            True,
        ),
        (
            helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
            "seq(tensor(float))",
            False,
        ),
    ],
)
def test_a_value_that_is_not_a_tensor_is_named_as_onnx_runtime_names_it(
    tmp_path: Path, value_type: onnx.TypeProto, shown: str, hinted: bool
) -> None:
    """A ZipMap output (skl2onnx's default for a classifier's probabilities) says which
    conversion option gives a tensor."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x_copy"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_value_info("probabilities", value_type)],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ModelConfigError) as caught:
        read_onnx_signature(path)
    message = str(caught.value)
    assert f"'probabilities' is {shown}, not a tensor" in message
    assert ("{'zipmap': False}" in message) is hinted
