"""Every provider option set batchserve can plan passes onnxruntime-gpu's own option parsers.

The plans come from the project's ``choose_providers`` and ``with_gpu_io`` for each thing a
config.pbtxt can ask for. Each is handed to ``InferenceSession`` exactly as planned, with ORT's
fallback off, over the stub CUDA runtime. The stub claims one device
(``CUDART_STUB_DEVICE_COUNT``), because the CUDA provider's parser checks ``device_id``
against the count; so a session gets through both parsers and stops at the provider's first
device call (``cudaSetDevice``), which fails. A rejected option stops it earlier, with the
parser's message: the control cases show the parsers do run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from batchserve.backends.onnx_options import (
    CPU_EP,
    ProviderPlan,
    ProviderSpec,
    choose_providers,
    tensorrt_profile,
    with_gpu_io,
)
from batchserve.core.device import Device
from batchserve.models.model_config import parse_pbtxt

from tests.gpu_contract.models import CONFIG

CUDA_EP = "CUDAExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"
# The first device call after the options are read, failing on the stub runtime.
DEVICE_CALL = re.compile(
    r"CUDA failure 100: no CUDA-capable device is detected .*expr=cudaSetDevice\(", re.S
)
PARSER_ERRORS = ("Invalid TensorRT EP option", "Unknown provider option", "Failed to parse")
STREAM = 0x5EED  # any value: the provider stores the handle before any device call
PROFILE = tensorrt_profile([("x", (8,))], 8, (4,))


def _accelerator(name: str, parameters: dict[str, str]) -> str:
    entries = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in parameters.items())
    return (
        "optimization { execution_accelerators { gpu_execution_accelerator "
        f'{{ name: "{name}" {entries} }} }} }}'
    )


TRT = _accelerator("tensorrt", {})
# What a config can ask for: (extra config.pbtxt, memory limit, with_gpu_io's arguments).
VARIANTS: dict[str, tuple[str, int | None, dict[str, Any]]] = {
    "cuda": ("", None, {}),
    "cuda-memory-limit": ("", 1 << 30, {}),
    "cuda-stream": ("", None, {"stream": STREAM}),
    "cuda-graphs": ("", None, {"stream": STREAM, "cuda_graphs": True}),
    "cuda-accelerator-parameters": (
        _accelerator(
            "cuda", {"cudnn_conv_algo_search": "HEURISTIC", "cudnn_conv_use_max_workspace": "1"}
        ),
        1 << 30,
        {"stream": STREAM},
    ),
    "cuda-triton-parameters": (
        'parameters { key: "cudnn_conv_algo_search" value { string_value: "0" } }'
        'parameters { key: "use_tf32" value { string_value: "1" } }',
        None,
        {"stream": STREAM},
    ),
    "tensorrt": (TRT, None, {}),
    "tensorrt-stream": (TRT, 1 << 30, {"stream": STREAM}),
    "tensorrt-graphs": (TRT, None, {"stream": STREAM, "cuda_graphs": True}),
    "tensorrt-profile": (TRT, None, {"stream": STREAM, "tensorrt_profile": PROFILE}),
    "tensorrt-fp16-workspace": (
        _accelerator(
            "tensorrt", {"precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30)}
        ),
        None,
        {"stream": STREAM, "tensorrt_profile": PROFILE},
    ),
    # Triton's documentation writes booleans as "1"; ORT's parser takes only True/False.
    "tensorrt-triton-booleans": (
        _accelerator(
            "tensorrt",
            {
                "trt_engine_cache_enable": "1",
                "trt_timing_cache_enable": "true",
                "trt_force_sequential_engine_build": "0",
                "trt_builder_optimization_level": "1",
            },
        ),
        None,
        {"stream": STREAM},
    ),
    "tensorrt-int8": (
        _accelerator(
            "tensorrt", {"precision_mode": "INT8", "trt_int8_use_native_calibration_table": "False"}
        ),
        None,
        {"stream": STREAM},
    ),
}


@pytest.fixture(autouse=True)
def _one_claimed_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDART_STUB_DEVICE_COUNT", "1")


def plan_for(variant: str, model_file: Path) -> ProviderPlan:
    """The providers batchserve would hand ORT for ``variant``, planned by its own code."""
    extra, memory_limit, gpu_io = VARIANTS[variant]
    config = parse_pbtxt(CONFIG + extra)
    plan = choose_providers(
        ort.get_available_providers(),
        config,
        Device("gpu", 0),
        model_file=model_file,
        memory_limit_bytes=memory_limit,
    )
    return with_gpu_io(plan, **gpu_io)


def session_error(model_file: Path, providers: list[ProviderSpec]) -> str:
    """Why ORT, with its fallback off, would not open a session with exactly ``providers``."""
    with pytest.raises(RuntimeError) as raised:
        ort.InferenceSession(
            str(model_file),
            providers=[name for name, _ in providers],
            provider_options=[options for _, options in providers],
            enable_fallback=0,
        )
    return str(raised.value)


def assert_stopped_at_the_device(error: str) -> None:
    rejected = [message for message in PARSER_ERRORS if message in error]
    assert not rejected, f"an option was rejected: {error}"
    assert DEVICE_CALL.search(error), f"not the stubbed device call: {error}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_planned_providers_pass_the_parsers(variant: str, mlp_file: Path) -> None:
    plan = plan_for(variant, mlp_file)
    assert plan.device == Device("gpu", 0)
    assert_stopped_at_the_device(session_error(mlp_file, list(plan.providers)))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("tensorrt")])
def test_each_provider_of_a_tensorrt_plan_passes_its_parser(variant: str, mlp_file: Path) -> None:
    """The TensorRT provider fails first, so the CUDA provider's options get a session alone."""
    plan = plan_for(variant, mlp_file)
    names = [name for name, _ in plan.providers]
    assert names == [TENSORRT_EP, CUDA_EP, CPU_EP]
    for provider in plan.providers[:2]:
        assert_stopped_at_the_device(session_error(mlp_file, [provider, (CPU_EP, {})]))


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (CUDA_EP, 'Unknown provider option: "bogus_key"'),
        (TENSORRT_EP, "Invalid TensorRT EP option: bogus_key"),
    ],
)
def test_control_the_parser_rejects_an_unknown_option(
    provider: str, message: str, mlp_file: Path
) -> None:
    plan = plan_for("tensorrt", mlp_file)
    options = dict(plan.providers)[provider] | {"bogus_key": "1"}
    error = session_error(mlp_file, [(provider, options), (CPU_EP, {})])
    assert message in error
    assert not DEVICE_CALL.search(error)


def test_control_without_a_claimed_device_the_parser_stops_at_device_id(
    mlp_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the stub claims a device: the CUDA parser reads the device count for device_id."""
    monkeypatch.delenv("CUDART_STUB_DEVICE_COUNT")
    plan = plan_for("cuda", mlp_file)
    error = session_error(mlp_file, list(plan.providers))
    assert 'Failed to parse provider option "device_id"' in error
    assert "no CUDA-capable device is detected" in error
