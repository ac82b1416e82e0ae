"""Every way an export can fail: a clear one-line error, the right exit code, nothing written."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from batchserve.devices.placement import gpu_count
from batchserve.export.tensorrt import GPU_MISSING
from torch import nn
from torch.nn import functional

IMAGE = "image:FP32:batch,3,8,8"


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image).mean((2, 3))


class CumprodNet(TinyNet):
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(self.conv(image).mean((2, 3)), dim=1)


class DropoutNet(TinyNet):
    """Dropout forced on whatever the mode: PyTorch and ONNX Runtime cannot agree."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return functional.dropout(self.conv(image), p=0.5, training=True).mean((2, 3))


class IgnoresMaskNet(TinyNet):
    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.conv(image).mean((2, 3))


class TracedBatchNet(TinyNet):
    """int() freezes the traced batch size into the graph: fine in PyTorch, wrong elsewhere."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image).reshape(int(image.shape[0]), 4 * 8 * 8)


class NotATensor:
    """Anything but tensors must be refused by torch.load(weights_only=True)."""


def assert_clean_failure(result: Any, code: int, repo: Path) -> None:
    assert result.code == code
    assert result.err.startswith("batchserve export: error: ")
    assert "Traceback" not in result.err
    assert not repo.exists() or not any(repo.rglob("*"))


def test_unsupported_operator_is_named(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(f"{__name__}:CumprodNet", "--name", "m", "--input", IMAGE)

    assert_clean_failure(result, 2, repo)
    assert (
        "cannot export CumprodNet to ONNX: operator 'aten::cumprod' is not supported" in result.err
    )


def test_wrong_rank_names_the_inputs_and_shapes(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(f"{__name__}:TinyNet", "--name", "m", "--input", "image:FP32:batch,3,8")

    assert_clean_failure(result, 2, repo)
    assert "TinyNet.forward failed on the declared inputs image: FP32[8, 3, 8]" in result.err


def test_more_inputs_than_forward_takes_names_both_lists(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    inputs = ("--input", "img:FP32:batch,3,8,8", "--input", "extra:FP32:batch,3")
    result = export_cli(f"{__name__}:TinyNet", "--name", "m", *inputs)

    assert_clean_failure(result, 2, repo)
    assert "2 input(s) declared (img, extra) but TinyNet.forward(image) takes 1" in result.err


def test_a_parameter_name_in_the_wrong_place_is_refused(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    # 'keep' is no parameter, so inputs bind by position, which would feed 'image' to 'mask'.
    inputs = ("--input", "keep:BOOL:batch,8", "--input", IMAGE)
    result = export_cli(f"{__name__}:IgnoresMaskNet", "--name", "m", *inputs)

    assert_clean_failure(result, 2, repo)
    assert (
        "input 'image' is declared at position 2 but is parameter 1 of "
        "IgnoresMaskNet.forward(image, mask)"
    ) in result.err


def test_input_the_graph_drops_is_named(export_cli: Callable[..., Any], repo: Path) -> None:
    inputs = ("--input", IMAGE, "--input", "mask:BOOL:batch,8")
    result = export_cli(f"{__name__}:IgnoresMaskNet", "--name", "m", *inputs)

    assert_clean_failure(result, 2, repo)
    assert "input 'mask' does not affect IgnoresMaskNet's outputs" in result.err


def test_output_names_must_match_the_outputs(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(
        f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE, "--output", "a", "b"
    )

    assert_clean_failure(result, 2, repo)
    assert "forward returns 1 output(s) but 2 --output name(s) were given (a, b)" in result.err


def test_disagreement_beyond_tolerance_exits_1_and_writes_nothing(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(f"{__name__}:DropoutNet", "--name", "m", "--input", IMAGE)

    assert_clean_failure(result, 1, repo)
    assert "ONNX Runtime disagrees with PyTorch in 3 of 3 cases" in result.err
    assert "pass if |got - expected| <= 0.0001 + 0.001 * |expected|" in result.out
    assert result.out.count("[FAILED]") == 3


def test_graph_frozen_at_the_traced_batch_fails_at_other_sizes(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(f"{__name__}:TracedBatchNet", "--name", "m", "--input", IMAGE)

    assert_clean_failure(result, 1, repo)
    assert "batch=1: ONNX Runtime failed to run:" in result.out
    assert re.search(r"batch=8: output0 max abs \S+, max rel \S+ \[ok\]", result.out)


def test_bad_spec_from_the_command_line(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(f"{__name__}:TinyNet", "--name", "m", "--input", "image:FP33:batch,3,8,8")

    assert_clean_failure(result, 2, repo)
    assert "--input 'image:FP33:batch,3,8,8': unknown datatype 'FP33'" in result.err


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_for_export:build", "cannot import no_such_module_for_export"),
        (f"{__name__}:Missing", "has no attribute 'Missing'"),
        (f"{__name__}:IMAGE", "is a str, not callable"),
        (f"{__name__}:NotATensor", "returned a NotATensor, not a torch.nn.Module"),
        ("no_colon", "must look like package.module:attr"),
    ],
)
def test_bad_factory(
    export_cli: Callable[..., Any], repo: Path, factory: str, message: str
) -> None:
    result = export_cli(factory, "--name", "m", "--input", IMAGE)

    assert_clean_failure(result, 2, repo)
    assert message in result.err


def test_mismatched_state_dict_lists_the_keys(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    weights = tmp_path / "weights.pt"
    torch.save({"conv.weight": torch.zeros(4, 3, 3, 3), "head.bias": torch.zeros(2)}, weights)

    result = export_cli(
        f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE, "--state-dict", str(weights)
    )

    assert_clean_failure(result, 2, repo)
    assert f"--state-dict {weights} does not fit" in result.err
    assert 'Missing key(s) in state_dict: "conv.bias"' in result.err
    assert 'Unexpected key(s) in state_dict: "head.bias"' in result.err


def test_state_dict_is_never_unpickled_unrestricted(
    export_cli: Callable[..., Any], repo: Path, tmp_path: Path
) -> None:
    weights = tmp_path / "weights.pt"
    torch.save({"conv.weight": NotATensor()}, weights)

    result = export_cli(
        f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE, "--state-dict", str(weights)
    )

    assert_clean_failure(result, 2, repo)
    assert "cannot load with weights_only" in result.err


def test_broken_existing_config_stops_before_any_file_moves(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text("max_batch_size: lots\n")

    result = export_cli(f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE)

    assert result.code == 2
    assert "config.pbtxt" in result.err
    assert not (repo / "m" / "1").exists()


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_tensorrt_without_a_gpu_fails_before_anything_else(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    # The factory does not even exist: the GPU check must come first.
    result = export_cli(
        "no_such_module_for_export:build", "--name", "m", "--input", IMAGE, "--tensorrt"
    )

    assert_clean_failure(result, 2, repo)
    assert result.err.strip() == f"batchserve export: error: {GPU_MISSING}"


def test_tensorrt_flags_need_tensorrt(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE, "--fp16")

    assert_clean_failure(result, 2, repo)
    assert "--fp16, --workspace-mib and --profile-batch-sizes need --tensorrt" in result.err


def test_profile_batch_sizes_need_tensorrt(export_cli: Callable[..., Any], repo: Path) -> None:
    result = export_cli(
        f"{__name__}:TinyNet", "--name", "m", "--input", IMAGE, "--profile-batch-sizes", "4"
    )

    assert_clean_failure(result, 2, repo)
    assert "need --tensorrt" in result.err


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ("4,80", r"optimisation profile batch sizes: batch sizes \[80\] are not within 1\.\.64"),
        ("4,x", r"--profile-batch-sizes '4,x': 'x' is not a positive integer"),
    ],
)
def test_bad_profile_batch_sizes_fail_before_the_gpu_check(
    export_cli: Callable[..., Any], repo: Path, sizes: str, message: str
) -> None:
    # Checked before the GPU and before the factory is imported (it does not exist).
    result = export_cli(
        "no_such_module_for_export:build",
        *("--name", "m", "--input", IMAGE, "--tensorrt", "--profile-batch-sizes", sizes),
    )

    assert_clean_failure(result, 2, repo)
    assert re.search(message, result.err), result.err
