"""A real TensorRT engine built from the verified ONNX file, checked against PyTorch (GPU only)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from batchserve.devices.placement import gpu_count
from batchserve.models.model_config import load_pbtxt
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU with CUDA"),
]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(8, 4)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).mean((2, 3)))


@pytest.mark.parametrize(
    ("precision", "checked"),
    [((), "TensorRT vs PyTorch"), (("--fp16",), "TensorRT FP16 vs ONNX Runtime FP32 (CPU)")],
    ids=["fp32", "fp16"],
)
def test_engine_is_built_verified_and_published(
    export_cli: Callable[..., Any], repo: Path, precision: tuple[str, ...], checked: str
) -> None:
    pytest.importorskip("tensorrt")
    result = export_cli(
        f"{__name__}:SmallCNN",
        *("--name", "cnn", "--input", "image:FP32:batch,3,16,16", "--max-batch-size", "16"),
        *("--tensorrt", "--workspace-mib", "256", *precision),
    )

    assert result.code == 0, result.err
    assert f"{checked}, 3 cases" in result.out
    assert (repo / "cnn" / "1" / "model.onnx").is_file()
    assert (repo / "cnn_trt" / "1" / "model.plan").stat().st_size > 0
    config = load_pbtxt(repo / "cnn_trt" / "config.pbtxt")
    assert (config.name, config.platform, config.backend) == (
        "cnn_trt",
        "tensorrt_plan",
        "tensorrt",
    )
    assert config.max_batch_size == 16
    assert [g.kind for g in config.instance_group] == [ModelInstanceGroup.KIND_GPU]
    assert [list(t.dims) for t in config.input] == [[3, 16, 16]]


def test_one_profile_per_preferred_batch_size(export_cli: Callable[..., Any], repo: Path) -> None:
    trt = pytest.importorskip("tensorrt")
    result = export_cli(
        f"{__name__}:SmallCNN",
        *("--name", "cnn", "--input", "image:FP32:batch,3,16,16", "--max-batch-size", "16"),
        *("--dynamic-batching", "--preferred-batch-size", "2", "8", "--batch-sizes", "1,2,5,8,16"),
        "--tensorrt",
    )

    assert result.code == 0, result.err
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine((repo / "cnn_trt" / "1" / "model.plan").read_bytes())
    assert engine.num_optimization_profiles == 3
    ranges = [engine.get_tensor_profile_shape("image", p) for p in range(3)]
    assert [(lo[0], opt[0], hi[0]) for lo, opt, hi in ranges] == [(1, 2, 2), (3, 8, 8), (9, 16, 16)]
