"""--input specs bind to forward's parameters by name when they can, by position otherwise."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from batchserve.models.model_config import load_pbtxt
from torch import nn


def build_sequential() -> nn.Sequential:
    """forward(input): no parameter is called 'image'."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5)
    )


class Scaled(nn.Module):
    def forward(self, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return values * scale


def test_sequential_takes_an_input_named_otherwise_by_position(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:build_sequential",
        *("--name", "seq", "--input", "image:FP32:batch,3,8,8", "--output", "scores"),
    )

    assert result.code == 0, result.err
    assert "[FAILED]" not in result.out
    config = load_pbtxt(repo / "seq" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in config.input] == [("image", [3, 8, 8])]
    image = np.random.default_rng(2).standard_normal((6, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(
        str(repo / "seq" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (scores,) = session.run(["scores"], {"image": image})
    with torch.no_grad():
        expected = build_sequential().eval()(torch.from_numpy(image)).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-3, atol=1e-5)


def test_too_many_inputs_for_a_sequential_name_both_lists(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:build_sequential",
        *("--name", "seq", "--input", "image:FP32:batch,3,8,8", "--input", "mask:BOOL:batch,8"),
    )

    assert result.code == 2
    assert (
        "batchserve export: error: 2 input(s) declared (image, mask) but "
        "Sequential.forward(input) takes 1; inputs whose names are not all forward's "
        "parameters are bound by position"
    ) in result.err
    assert not repo.exists()


def test_matching_names_still_bind_by_name_in_any_order(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    # Declared scale first: bound by name, so the graph's 'values' is forward's values.
    result = export_cli(
        f"{__name__}:Scaled",
        *("--name", "scaled", "--input", "scale:FP32:batch,1:2..3"),
        *("--input", "values:FP32:batch,4"),
    )

    assert result.code == 0, result.err
    config = load_pbtxt(repo / "scaled" / "config.pbtxt")
    assert sorted((t.name, list(t.dims)) for t in config.input) == [
        ("scale", [1]),
        ("values", [4]),
    ]
    session = ort.InferenceSession(
        str(repo / "scaled" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.array([[2.0], [3.0]], dtype=np.float32)
    (got,) = session.run(None, {"values": values, "scale": scale})
    np.testing.assert_array_equal(got, values * scale)


def test_names_that_are_not_parameters_bind_in_declared_order(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:Scaled",
        *("--name", "scaled", "--input", "x:FP32:batch,4", "--input", "k:FP32:batch,1"),
    )

    assert result.code == 0, result.err
    session = ort.InferenceSession(
        str(repo / "scaled" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["x", "k"]
    values = np.ones((1, 4), dtype=np.float32)
    (got,) = session.run(None, {"x": values, "k": np.array([[5.0]], dtype=np.float32)})
    np.testing.assert_array_equal(got, values * 5)
