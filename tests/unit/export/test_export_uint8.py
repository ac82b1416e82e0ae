"""`batchserve export --normalize`: a graph that takes image bytes, checked against its FP32 twin
(the same module exported for float NCHW input) fed the equivalent floats."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from batchserve.export.image_input import ImageInput
from batchserve.models.model_config import load_pbtxt
from batchserve.proto.model_config_pb2 import DataType
from torch import nn

FACTORY = f"{__name__}:build_net"
MEAN = "mean=0.485,0.456,0.406"
STD = "std=0.229,0.224,0.225"
CONVERSION = ImageInput("image", "NHWC", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class TinyNet(nn.Module):
    """conv-bn-relu and a linear head: BatchNorm so that eval mode matters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.head = nn.Linear(6, 5)
        self.features[1].running_mean.uniform_(-0.5, 0.5)
        self.features[1].running_var.uniform_(0.5, 2.0)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.features(image).mean((2, 3)))
        return logits, torch.softmax(logits, dim=1)


def build_net() -> TinyNet:
    return TinyNet()


def _session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "1" / "model.onnx"))


def test_a_uint8_export_matches_its_fp32_twin(export_cli: Callable[..., Any], repo: Path) -> None:
    twin = export_cli(FACTORY, "--name", "fp32", "--input", "image:FP32:batch,3,h,w")
    result = export_cli(
        FACTORY,
        *("--name", "bytes", "--input", "image:UINT8:batch,h,w,3", "--normalize", MEAN, STD),
        *("--output", "logits", "probabilities", "--axis-sizes", "h=8", "w=8,13"),
    )

    assert twin.code == 0, twin.err
    assert result.code == 0, result.err
    assert "image sent as bytes: image: UINT8 NHWC -> FP32 NCHW as (x * 0.00392157" in result.out
    assert "batch=8 h=8 w=13: logits max abs" in result.out
    config = load_pbtxt(repo / "bytes" / "config.pbtxt")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("image", DataType.TYPE_UINT8, [-1, -1, 3])
    ]
    raw = np.random.default_rng(5).integers(0, 256, size=(4, 9, 11, 3)).astype(np.uint8)
    got = _session(repo, "bytes").run(None, {"image": raw})
    expected = _session(repo, "fp32").run(None, {"image": CONVERSION.to_float(raw)})
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_the_conversion_is_the_graphs_first_nodes(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        FACTORY, "--name", "bytes", "--input", "image:UINT8:batch,8,8,3", "--normalize", MEAN
    )

    assert result.code == 0, result.err
    graph = onnx.load(str(repo / "bytes" / "1" / "model.onnx")).graph
    ops = [node.op_type for node in graph.node if node.op_type != "Constant"]
    assert ops[:5] == ["Cast", "Transpose", "Mul", "Add", "Conv"]
    assert graph.node[0].input == ["image"]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8


def test_nchw_bytes_need_no_transpose(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(
        FACTORY, "--name", "planar", "--input", "image:UINT8:batch,3,8,8", "--normalize", "mean=0.5"
    )

    assert result.code == 0, result.err
    graph = onnx.load(str(repo / "planar" / "1" / "model.onnx")).graph
    assert "Transpose" not in [node.op_type for node in graph.node]
    assert list(load_pbtxt(repo / "planar" / "config.pbtxt").input[0].dims) == [3, 8, 8]


def test_a_conversion_that_only_casts_adds_only_a_cast(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        FACTORY,
        *("--name", "raw", "--input", "image:UINT8:batch,3,8,8:0..9", "--normalize", "scale=1"),
    )

    assert result.code == 0, result.err
    graph = onnx.load(str(repo / "raw" / "1" / "model.onnx")).graph
    assert [node.op_type for node in graph.node][:2] == ["Cast", "Conv"]


def test_a_wrong_conversion_in_the_graph_fails_verification(
    export_cli: Callable[..., Any], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference converts in numpy, so a graph whose conversion is off cannot pass."""
    right = ImageInput.affine

    def off_by_one_percent(self: ImageInput) -> tuple[np.ndarray, np.ndarray]:
        multiplier, offset = right(self)
        return multiplier * np.float32(1.01), offset

    monkeypatch.setattr(ImageInput, "affine", off_by_one_percent)
    result = export_cli(
        FACTORY, "--name", "bytes", "--input", "image:UINT8:batch,8,8,3", "--normalize", MEAN, STD
    )

    assert result.code == 1
    assert "ONNX Runtime disagrees with PyTorch" in result.err
    assert not (repo / "bytes").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "image:FP32:batch,8,8,3", "--normalize", MEAN], "needs a UINT8 input"),
        (
            ["--input", "image:UINT8:batch,8,8,3", "--layout", "NHWC"],
            "--layout .* needs --normalize",
        ),
        (["--input", "image:UINT8:batch,8,8,3", "--normalize", "mean=1,2"], "mean has 2 values"),
    ],
)
def test_bad_image_arguments_exit_2_naming_the_problem(
    export_cli: Callable[..., Any], repo: Path, argv: list[str], message: str
) -> None:
    result = export_cli(FACTORY, "--name", "bytes", *argv)

    assert result.code == 2
    assert result.err.startswith("batchserve export: error: ")
    assert re.search(message, result.err), result.err
    assert not repo.exists()


def test_pt2_takes_the_bytes_too(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(
        FACTORY,
        *("--name", "bytes", "--format", "pt2", "--input", "image:UINT8:batch,8,8,3"),
        *("--normalize", MEAN, STD, "--max-batch-size", "4", "--batch-sizes", "1,4"),
    )

    assert result.code == 0, result.err
    config = load_pbtxt(repo / "bytes" / "config.pbtxt")
    assert (config.platform, config.input[0].data_type) == ("torch_export", DataType.TYPE_UINT8)
    assert list(config.input[0].dims) == [8, 8, 3]
