"""`batchserve export --format pt2`: a verified torch.export program the server can load."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from batchserve.backends.torch_pt2 import TorchBackend
from batchserve.core.device import CPU
from batchserve.models.model_config import load_pbtxt
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import DataType
from torch import nn
from torch.nn import functional

IMAGE = "image:FP32:batch,3,8,8"


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.conv(image).mean((2, 3))
        return pooled, torch.softmax(pooled, dim=1)


class Pooling(nn.Module):
    """tokens[batch, seq] -> mean embedding: the sequence axis stays dynamic."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens).mean(dim=1)


class DropoutNet(TwoHeads):
    """Dropout forced on: the program and the eager module draw different masks."""

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return functional.dropout(self.conv(image), p=0.5, training=True).mean((2, 3)), image


class TracedBatchNet(TwoHeads):
    """int() freezes the batch size: torch.export refuses the dynamic batch axis."""

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = self.conv(image).reshape(int(image.shape[0]), 4 * 8 * 8)
        return flat, flat


def served(path: Path) -> TorchBackend:
    backend = TorchBackend()
    backend.load(path, load_pbtxt(path.parent.parent / "config.pbtxt"), CPU)
    assert backend.device == CPU
    return backend


def test_pt2_export_is_verified_and_lands_in_the_repository(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:TwoHeads",
        *("--name", "heads", "--input", IMAGE, "--output", "scores", "probabilities"),
        *("--max-batch-size", "16", "--format", "pt2", "--dynamic-batching"),
    )

    assert result.code == 0, result.err
    assert "torch.export (batchserve's loader, CPU) vs PyTorch, 3 cases" in result.out
    assert "FAILED" not in result.out
    assert sorted(p.name for p in (repo / "heads").rglob("*")) == [
        "1",
        "config.pbtxt",
        "model.pt2",
    ]
    config = load_pbtxt(repo / "heads" / "config.pbtxt")
    assert (config.platform, config.backend, config.max_batch_size) == (
        "torch_export",
        "pytorch",
        16,
    )
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("image", DataType.TYPE_FP32, [3, 8, 8])
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [
        ("scores", [4]),
        ("probabilities", [4]),
    ]
    assert ModelRepository(repo).resolve("heads").config.platform == "torch_export"
    image = np.random.default_rng(5).standard_normal((5, 3, 8, 8)).astype(np.float32)
    got = served(repo / "heads" / "1" / "model.pt2").infer({"image": image})
    with torch.no_grad():
        want = TwoHeads().eval()(torch.from_numpy(image))
    np.testing.assert_allclose(got["scores"], want[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["probabilities"], want[1].numpy(), rtol=1e-5, atol=1e-6)


def test_named_axes_other_than_the_batch_stay_dynamic(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:Pooling",
        *("--name", "pool", "--input", "tokens:INT64:batch,seq:0..9", "--format", "pt2"),
        *("--axis-sizes", "seq=1,5,40", "--max-batch-size", "8"),
    )

    assert result.code == 0, result.err
    assert "batch=8 seq=40: output0" in result.out
    config = load_pbtxt(repo / "pool" / "config.pbtxt")
    assert [list(t.dims) for t in config.input] == [[-1]]
    tokens = np.arange(3 * 57, dtype=np.int64).reshape(3, 57) % 10  # a length never tested
    got = served(repo / "pool" / "1" / "model.pt2").infer({"tokens": tokens})["output0"]
    with torch.no_grad():
        want = Pooling().eval()(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_program_that_disagrees_with_pytorch_exits_1_and_writes_nothing(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:DropoutNet", "--name", "m", "--input", IMAGE, "--format", "pt2"
    )

    assert result.code == 1
    assert "torch.export (batchserve's loader, CPU) disagrees with PyTorch" in result.err
    assert not repo.exists() or not any(repo.rglob("*"))


def test_a_module_that_freezes_the_batch_cannot_be_exported(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(
        f"{__name__}:TracedBatchNet", "--name", "m", "--input", IMAGE, "--format", "pt2"
    )

    assert result.code == 2
    assert result.err.startswith("batchserve export: error: cannot export TracedBatchNet with ")
    assert "Traceback" not in result.err
    assert not repo.exists() or not any(repo.rglob("*"))


def test_tensorrt_is_built_from_onnx_only(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(
        f"{__name__}:TwoHeads", "--name", "m", "--input", IMAGE, "--format", "pt2", "--tensorrt"
    )

    assert result.code == 2
    assert "--tensorrt builds the engine from the ONNX model: use --format onnx" in result.err
