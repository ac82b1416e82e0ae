"""A residual CNN through `batchserve export`: files, config, weights, and re-export."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from batchserve.export.onnx import export_onnx
from batchserve.export.spec import ExportSpec, parse_input_spec
from batchserve.models.model_config import load_pbtxt, to_pbtxt
from batchserve.proto.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelInstanceGroup
from torch import nn

FACTORY = f"{__name__}:build_resnet"
IMAGE = "image:FP32:batch,3,16,16"


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(ResidualBlock(width), nn.MaxPool2d(2), ResidualBlock(width))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width, classes)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.pool(self.blocks(self.stem(image))).flatten(1))
        return logits, torch.softmax(logits, dim=1)


def build_resnet(classes: int = 10, seed: int = 0) -> SmallResNet:
    """Random weights and running statistics, so eval-mode BatchNorm is not an identity."""
    torch.manual_seed(seed)
    model = SmallResNet(classes)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def run_onnx(path: Path, image: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, {"image": image}))


def test_cnn_exports_validates_and_lands_in_the_repository(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        FACTORY,
        *("--name", "resnet", "--input", IMAGE, "--output", "logits", "probabilities"),
        *("--factory-kwargs", '{"classes": 4}', "--max-batch-size", "16"),
    )

    assert result.code == 0, result.err
    assert "pass if |got - expected| <= 0.0001 + 0.001 * |expected|" in result.out
    for batch in (1, 3, 8):
        assert f"batch={batch}: logits max abs" in result.out
    assert "FAILED" not in result.out
    model_file = repo / "resnet" / "1" / "model.onnx"
    assert sorted(p.name for p in (repo / "resnet").rglob("*")) == [
        "1",
        "config.pbtxt",
        "model.onnx",
    ]
    config = load_pbtxt(repo / "resnet" / "config.pbtxt")
    assert (config.name, config.platform, config.backend) == (
        "resnet",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == 16
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("image", DataType.TYPE_FP32, [3, 16, 16])
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("logits", DataType.TYPE_FP32, [4]),
        ("probabilities", DataType.TYPE_FP32, [4]),
    ]
    image = np.random.default_rng(7).standard_normal((5, 3, 16, 16)).astype(np.float32)
    logits, probabilities = run_onnx(model_file, image)
    expected = build_resnet(classes=4).eval()(torch.from_numpy(image))
    np.testing.assert_allclose(logits, expected[0].detach().numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_state_dict_weights_are_the_ones_exported(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    trained = build_resnet(seed=1)
    weights = tmp_path / "weights.pt"
    torch.save(trained.state_dict(), weights)

    result = export_cli(FACTORY, "--name", "resnet", "--input", IMAGE, "--state-dict", str(weights))

    assert result.code == 0, result.err
    image = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = run_onnx(repo / "resnet" / "1" / "model.onnx", image)[0]
    expected = trained.eval()(torch.from_numpy(image))[0].detach().numpy()
    untrained = build_resnet(seed=0).eval()(torch.from_numpy(image))[0].detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    assert not np.allclose(got, untrained, atol=1e-3)


def test_reexport_keeps_user_set_config_fields(export_cli: Callable[..., Any], repo: Path) -> None:
    assert export_cli(FACTORY, "--name", "resnet", "--input", IMAGE).code == 0
    config_file = repo / "resnet" / "config.pbtxt"
    tuned = load_pbtxt(config_file)
    tuned.instance_group.add(kind=ModelInstanceGroup.KIND_CPU, count=2)
    tuned.input[0].format = ModelInput.FORMAT_NCHW
    tuned.parameters["owner"].string_value = "vision"
    tuned.batchserve.memory_budget_bytes = 1 << 30
    tuned.version_policy.latest.num_versions = 2
    config_file.write_text(to_pbtxt(tuned))

    result = export_cli(
        FACTORY,
        *("--name", "resnet", "--input", IMAGE, "--version", "2", "--max-batch-size", "8"),
        *(
            "--factory-kwargs",
            '{"classes": 3}',
            "--dynamic-batching",
            "--max-queue-delay-us",
            "500",
        ),
    )

    assert result.code == 0, result.err
    config = load_pbtxt(config_file)
    assert (repo / "resnet" / "2" / "model.onnx").is_file()
    assert (repo / "resnet" / "1" / "model.onnx").is_file()
    assert config.max_batch_size == 8
    assert [list(t.dims) for t in config.output] == [[3], [3]]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert len(config.instance_group) == 1
    assert config.instance_group[0].count == 2
    assert config.input[0].format == ModelInput.FORMAT_NCHW
    assert config.parameters["owner"].string_value == "vision"
    assert config.batchserve.memory_budget_bytes == 1 << 30
    assert config.version_policy.latest.num_versions == 2


def test_python_api_returns_a_report_of_what_it_wrote(tmp_path: Path) -> None:
    spec = ExportSpec("resnet", (parse_input_spec(IMAGE),), max_batch_size=4, batch_sizes=(1, 4))
    seen: list[str] = []

    report = export_onnx(build_resnet(), spec, tmp_path, progress=lambda r: seen.extend(r.lines()))

    (published,) = report.models
    assert published.model_file == tmp_path / "resnet" / "1" / "model.onnx"
    assert isinstance(load_pbtxt(published.config_file), ModelConfig)
    assert [t.name for t in report.signature.outputs] == ["output0", "output1"]
    assert report.signature.inputs[0].shape == (-1, 3, 16, 16)
    assert published.verification.passed
    assert len(published.verification.cases) == 2
    assert published.verification.max_abs < 1e-4
    assert seen[0].startswith("ONNX Runtime vs PyTorch, 2 cases")


def test_model_without_batch_axis_keeps_named_spatial_axes(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        FACTORY,
        *("--name", "fixed", "--input", "image:FP32:2,3,h,w", "--max-batch-size", "0"),
        *("--axis-sizes", "h=8,12", "w=16"),
    )

    assert result.code == 0, result.err
    assert "h=8 w=16: output0" in result.out
    assert "h=12 w=16: output0" in result.out
    config = load_pbtxt(repo / "fixed" / "config.pbtxt")
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [2, 3, -1, -1]
    assert [list(t.dims) for t in config.output] == [[2, 10], [2, 10]]
