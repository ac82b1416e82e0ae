"""A GPU instance whose providers cannot start fails saying why, or, where the config allows
it, runs on the CPU; ONNX Runtime never quietly rebuilds the session on its own.

ORT's ``InferenceSession`` answers a provider that fails to start by printing "EP Error ...
Falling back to ..." and rebuilding the session without any provider options (no device,
memory cap or stream). batchserve must not let that happen. The GPU fails here as on a machine
whose driver sees no GPU (stub runtime), or one that lists a device it cannot open.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable
from batchserve.models.model_config import parse_pbtxt

from tests.gpu_contract.models import CONFIG, reference

ORT_FALLBACK = ("EP Error", "Falling back to")
WHAT_FAILED = "no CUDA-capable device is detected"
TENSORRT = 'gpu_execution_accelerator { name: "tensorrt" }'
ACCELERATORS = {
    "cuda": "",
    "tensorrt": f"optimization {{ execution_accelerators {{ {TENSORRT} }} }}",
}
WORLDS = {"no device": "0", "listed but unusable": "1"}


def assert_ort_did_not_fall_back(capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    printed = [line for line in (out + err).splitlines() if line.startswith(ORT_FALLBACK)]
    assert not printed, f"ORT rebuilt the session itself: {printed}"


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("claimed", WORLDS.values(), ids=WORLDS)
def test_a_gpu_that_cannot_start_is_device_unavailable_saying_why(
    accelerator: str,
    claimed: str,
    mlp_file: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDART_STUB_DEVICE_COUNT", claimed)
    backend = OnnxBackend()
    with pytest.raises(DeviceUnavailable) as raised:
        backend.load(mlp_file, parse_pbtxt(CONFIG + ACCELERATORS[accelerator]), Device("gpu", 0))
    assert WHAT_FAILED in raised.value.message
    assert_ort_did_not_fall_back(capfd)


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_allow_cpu_fallback_runs_on_the_cpu_and_says_so(
    accelerator: str,
    mlp_file: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_pbtxt(
        CONFIG + ACCELERATORS[accelerator] + "batchserve { allow_cpu_fallback: true }"
    )
    backend = OnnxBackend()
    with caplog.at_level(logging.WARNING, logger="batchserve"):
        backend.load(mlp_file, config, Device("gpu", 0))
    try:
        assert backend.device == CPU
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("CPU" in w and "gpu:0" in w for w in warnings), warnings
        x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
        np.testing.assert_allclose(backend.infer({"x": x})["y"], reference(x), rtol=1e-6)
    finally:
        backend.unload()
    assert_ort_did_not_fall_back(capfd)
