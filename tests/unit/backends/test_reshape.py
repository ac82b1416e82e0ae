"""Triton's reshape: clients use ``dims``, the runtime sees ``reshape.shape``, both ways."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.reshape import ReshapedBackend, target_shape, with_reshape
from batchserve.backends.selection import create_backend
from batchserve.core.device import CPU, Device
from batchserve.core.errors import InvalidArgument
from batchserve.core.signature import ModelSignature
from batchserve.models.config_validation import config_problems
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx_models import FP32, build_model, write_model

BATCHED = """
name: "r"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 3, 2 ] } },
        { name: "z" data_type: TYPE_FP32 dims: [ 2, 3 ] }]
"""


class Recorder:
    """Answers y = x transposed per sample, z = x, and remembers what it was given."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, ...]] = {}

    @property
    def device(self) -> Device:
        return CPU

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature((), ())

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        pass

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.seen = {name: array.shape for name, array in inputs.items()}
        x = inputs["x"]
        return {"y": np.swapaxes(x, 1, 2), "z": x}

    def memory_bytes(self) -> int | None:
        return None

    def release_after_next_run(self) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def unload(self) -> None:
        pass


def test_inputs_reach_the_model_reshaped_and_outputs_return_in_dims() -> None:
    inner = Recorder()
    backend = with_reshape(inner, parse_pbtxt(BATCHED))
    x = np.arange(18, dtype=np.float32).reshape(3, 6)
    outputs = backend.infer({"x": x})
    assert inner.seen == {"x": (3, 2, 3)}  # per sample, the batch axis kept in front
    assert outputs["y"].shape == (3, 6)
    np.testing.assert_array_equal(outputs["y"][0], x[0].reshape(2, 3).T.reshape(6))
    assert outputs["z"].shape == (3, 2, 3)  # no reshape on z: untouched


def test_a_model_that_does_not_batch_reshapes_the_whole_tensor() -> None:
    config = parse_pbtxt(
        'max_batch_size: 0 input [{ name: "x" data_type: TYPE_FP32 dims: [3, 2] '
        "reshape { shape: [1, 2, 3] } }]"
    )
    inner = Recorder()
    with_reshape(inner, config).infer({"x": np.zeros((3, 2), np.float32)})
    assert inner.seen == {"x": (1, 2, 3)}


def test_without_reshape_the_runtime_backend_is_returned_as_it_is() -> None:
    inner = Recorder()
    assert with_reshape(inner, parse_pbtxt("max_batch_size: 4")) is inner
    config = parse_pbtxt(BATCHED)
    assert isinstance(create_backend(config, Path("model.onnx")), ReshapedBackend)


@pytest.mark.parametrize(
    ("shape", "source", "target", "expected"),
    [
        ((2, 4, 5, 6), (2, 4, -1, 6), (8, -1, 1, 6), (8, 5, 1, 6)),
        ((7, 3), (-1, 3), (-1, 1, 3), (7, 1, 3)),
        ((7, 9), (-1, -1), (-1, 1, -1), (7, 1, 9)),
        ((1,), (1,), (), ()),
    ],
)
def test_free_axes_pair_up_in_order(
    shape: tuple[int, ...],
    source: tuple[int, ...],
    target: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    assert target_shape(shape, source, target) == expected


def test_a_tensor_that_cannot_take_the_reshape_is_an_invalid_argument() -> None:
    config = parse_pbtxt(
        'max_batch_size: 0 input [{ name: "x" data_type: TYPE_FP32 dims: [-1] '
        "reshape { shape: [-1, 2] } }]"
    )
    with pytest.raises(InvalidArgument, match="input 'x': shape \\[3\\] cannot be reshaped"):
        with_reshape(Recorder(), config).infer({"x": np.zeros(3, np.float32)})


@pytest.mark.parametrize(
    ("tensor", "max_batch_size", "problem"),
    [
        ("dims: [6] reshape { shape: [4] }", 4, "has different size for dims and reshape"),
        ("dims: [2, -1] reshape { shape: [-1, 2] }", 4, "has different size for dims and reshape"),
        (
            "dims: [-1] reshape { shape: [-1, -1] }",
            4,
            "has different number of variable-size dimensions for dims and reshape for r",
        ),
        (
            "dims: [2, -1] reshape { shape: [2, -1, -1] }",
            0,
            "has different number of variable-size dimensions for dims and reshape",
        ),
        ("dims: [4] reshape { shape: [-1] }", 4, "has different size for dims and reshape for r"),
        ("dims: [1] reshape { shape: [] }", 0, "cannot have empty reshape for non-batching"),
        ("dims: [4] reshape { shape: [0, 4] }", 4, "reshape dimensions must be integer >= 1"),
    ],
)
def test_reshapes_triton_refuses_are_config_problems(
    tensor: str, max_batch_size: int, problem: str
) -> None:
    config = parse_pbtxt(
        f'name: "r" max_batch_size: {max_batch_size} '
        f'input [{{ name: "x" data_type: TYPE_FP32 {tensor} }}]'
    )
    problems = config_problems(config, source="r/config.pbtxt", directory="r")
    assert any(
        p.startswith("r/config.pbtxt: model input 'x' ") and problem in p for p in problems
    ), problems


@pytest.mark.parametrize(
    "tensor",
    [
        "dims: [3, 224, 224] reshape { shape: [1, 3, 224, 224] }",
        "dims: [2, 4, -1, 6] reshape { shape: [8, -1, 1, 6] }",
        "dims: [1] reshape { shape: [] }",
    ],
)
def test_reshapes_triton_accepts_pass(tensor: str) -> None:
    config = parse_pbtxt(f'max_batch_size: 4 input [{{ name: "x" data_type: TYPE_FP32 {tensor} }}]')
    assert config_problems(config, source="r/config.pbtxt", directory="r") == []


def test_a_scalar_written_as_dims_of_one_reaches_the_runtime_as_a_scalar(tmp_path: Path) -> None:
    """Triton's rule for a model that does not batch: clients send and receive the config's
    dims of 1, ONNX Runtime takes and gives a scalar."""
    path = write_model(tmp_path / "model.onnx", build_model((("x", FP32, ()),), (("y", FP32, ()),)))
    config = parse_pbtxt(
        'max_batch_size: 0 input [{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 1, 1 ] }]'
    )
    backend = create_backend(config, path)
    backend.load(path, config, CPU)
    try:
        y = backend.infer({"x": np.array([2.5], dtype=np.float32)})["y"]
    finally:
        backend.unload()
    assert y.shape == (1, 1)
    assert y[0, 0] == 2.5  # the model is an identity
