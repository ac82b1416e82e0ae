"""The GPU check's discovery: each runtime it cannot use is named with the reason, and the
machine checks run before anything is installed say what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import discover, preflight
from bench.gpu.discover import CPU_EP, CUDA_EP
from bench.gpu.runtimes import CPU_RUNTIMES, GPU_RUNTIMES, ORT_CUDA, PT2_CUDA, TENSORRT


def test_cpu_onnxruntime_is_skipped_as_the_cpu_build() -> None:
    reason = discover.ort_reason("1.30.0", [CPU_EP], None, CUDA_EP)
    assert reason == (
        "onnxruntime 1.30.0 has no CUDAExecutionProvider (providers: CPUExecutionProvider); "
        "it needs onnxruntime-gpu"
    )


def test_a_listed_cuda_provider_that_falls_back_is_skipped() -> None:
    reason = discover.ort_reason("1.22.0", [CUDA_EP, CPU_EP], [CPU_EP], CUDA_EP)
    assert "lists CUDAExecutionProvider, but a session ran on CPUExecutionProvider" in reason
    assert "cuDNN" in reason


def test_a_cuda_session_that_could_not_be_made_is_skipped() -> None:
    assert "ran on nothing" in discover.ort_reason("1.22.0", [CUDA_EP, CPU_EP], [], CUDA_EP)


def test_a_cuda_session_on_cuda_is_used() -> None:
    assert discover.ort_reason("1.22.0", [CUDA_EP, CPU_EP], [CUDA_EP, CPU_EP], CUDA_EP) == ""


def test_tensorrt_reasons() -> None:
    missing = discover.tensorrt_reason("No module named 'tensorrt'", False)
    assert missing == "import tensorrt failed: No module named 'tensorrt'"
    assert "cuda-python" in discover.tensorrt_reason("", False)
    assert discover.tensorrt_reason("", True) == ""


@pytest.mark.parametrize(
    ("built", "available", "expected"),
    [
        (None, False, "torch 2.11.0 is a CPU-only build (torch.version.cuda is None)"),
        ("13.0", False, "torch 2.11.0 (CUDA 13.0): torch.cuda.is_available() is False"),
        ("13.0", True, ""),
    ],
)
def test_torch_reasons(built: str | None, available: bool, expected: str) -> None:
    assert discover.torch_reason("2.11.0", built, available, gpu=True) == expected


def test_torch_on_the_cpu_needs_no_cuda() -> None:
    assert discover.torch_reason("2.13.0+cpu", None, False, gpu=False) == ""


def test_pt2_reasons() -> None:
    without = "usage: batchserve export FACTORY --name NAME [--tensorrt]"
    assert (
        discover.pt2_reason(without, "") == "batchserve export has no --format pt2 in this checkout"
    )
    with_format = "[--format {onnx,pt2}]"
    assert discover.pt2_reason(with_format, "no runtime for .pt2") == (
        "batchserve cannot serve model.pt2 here: no runtime for .pt2"
    )
    assert discover.pt2_reason(with_format, "") == ""


def test_the_dry_run_lists_every_gpu_runtime_as_not_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discover, "_probe", lambda spec: ("9.9", ""))
    found = discover.discover(CPU_RUNTIMES, cpu=True)
    assert [s.key for s in found if s.present] == [s.key for s in CPU_RUNTIMES]
    skipped = [s for s in found if not s.present]
    assert [s.key for s in skipped] == [s.key for s in GPU_RUNTIMES]
    assert {s.reason for s in skipped} == {discover.CPU_MODE}


def test_each_runtime_is_probed_by_its_own_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discover, "_onnxruntime", lambda provider: ("1", f"ort {provider}"))
    monkeypatch.setattr(discover, "_tensorrt", lambda: ("", "trt"))
    monkeypatch.setattr(discover, "_pt2", lambda gpu: ("2", f"pt2 gpu={gpu}"))
    found = {s.key: s.reason for s in discover.discover(GPU_RUNTIMES, cpu=False)}
    assert found == {
        ORT_CUDA.key: f"ort {CUDA_EP}",
        TENSORRT.key: "trt",
        PT2_CUDA.key: "pt2 gpu=True",
    }


def test_this_checkout_exports_and_serves_pt2_or_says_why_not() -> None:
    reason = discover.pt2_reason(discover.export_help(), discover._pt2_refusal())
    assert reason in ("", "batchserve export has no --format pt2 in this checkout") or (
        reason.startswith("batchserve cannot serve model.pt2 here")
    )


def test_preflight_names_every_missing_piece() -> None:
    found = preflight.problems((3, 13), 0, "libnvidia-ml.so.1 cannot be loaded", smi=False)
    assert found == [
        "Python 3.13: the check runs on 3.11 or 3.12 (set GPU_CHECK_PYTHON to such an interpreter)",
        "no NVIDIA driver: no nvidia-smi on the PATH, and libnvidia-ml.so.1 cannot be loaded",
    ]
    assert preflight.problems((3, 12), 0, "", smi=True) == [
        "the NVIDIA driver sees no GPU (NVML reports 0 devices)"
    ]
    assert preflight.problems((3, 11), 1, "", smi=True) == []


def test_preflight_on_a_machine_without_a_gpu_stops_with_the_reason() -> None:
    if preflight.nvml_devices()[0] > 0:
        pytest.skip("this machine has a GPU")
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu.preflight"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "no NVIDIA driver" in done.stderr
    assert "GPU_CHECK_CPU=1 make gpu-check" in done.stderr


def test_gpu_check_without_a_gpu_stops_before_installing_anything(tmp_path: Path) -> None:
    if preflight.nvml_devices()[0] > 0:
        pytest.skip("this machine has a GPU")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GPU_CHECK_CPU": "0", "GPU_CHECK_VENV": str(tmp_path / "venv")}
    done = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh")], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 1
    assert "gpu-check: this machine cannot run the GPU check" in done.stderr
    assert not (tmp_path / "venv").exists()
