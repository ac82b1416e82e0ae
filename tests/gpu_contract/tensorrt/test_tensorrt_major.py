"""The pass imports the TensorRT major it was started for (PYTHONPATH picks the bindings)."""

from __future__ import annotations

import os


def test_this_pass_runs_the_tensorrt_major_it_was_given(major: int) -> None:
    expected = os.environ.get("GPU_CONTRACT_TENSORRT")
    assert expected is not None, "GPU_CONTRACT_TENSORRT is not set: run make gpu-contract"
    assert major == int(expected)
