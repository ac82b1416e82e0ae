"""Fixtures of the GPU contract tests: where the stub libraries are, the simulated GPUs NVML
reports, and a model file.

The tests need the contract virtualenv with ``GPU_CONTRACT_STUBS`` naming the stub directory
(also first on ``LD_LIBRARY_PATH``). Elsewhere the session stops, saying how to run them,
rather than skipping: a green run always means the contract was checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.gpu_contract.models import write_mlp
from tests.stubs.nvml import SONAME, pynvml_over

STUBS_VARIABLE = "GPU_CONTRACT_STUBS"
HOW_TO_RUN = "the GPU contract tests run in their own virtualenv: make gpu-contract"
# Two boards as NVML reports them; the second has no power sensor (and no power limit or
# energy count).
TWO_GPUS = {
    "NVML_STUB_GPUS": "2",
    "NVML_STUB_NAMES": "NVIDIA A10G,Tesla T4",
    "NVML_STUB_UUIDS": (
        "GPU-00112233-4455-6677-8899-aabbccddeeff,GPU-ffeeddcc-bbaa-9988-7766-554433221100"
    ),
    "NVML_STUB_MEMORY_TOTAL": f"{24 << 30},{16 << 30}",
    "NVML_STUB_MEMORY_USED": f"{1 << 30},{2 << 30}",
    "NVML_STUB_UTILIZATION": "37,5",
    "NVML_STUB_TEMPERATURE": "54,47",
    "NVML_STUB_POWER_MW": "61250,-",
    "NVML_STUB_POWER_LIMIT_MW": "300000,-",
    "NVML_STUB_ENERGY_MJ": "7000000,-",
    "NVML_STUB_ENERGY_STEP_MJ": "1250",
}


@pytest.fixture(scope="session")
def stubs() -> Path:
    """The directory of stub libraries the contract virtualenv was built with."""
    where = os.environ.get(STUBS_VARIABLE)
    if not where or not (Path(where) / SONAME).is_file():
        pytest.exit(f"{STUBS_VARIABLE} names no stub directory; {HOW_TO_RUN}", returncode=4)
    return Path(where)


@pytest.fixture(autouse=True)
def _contract_environment(stubs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts on a machine whose driver sees no GPU, through NVML or CUDA."""
    for name in [*TWO_GPUS, "NVML_STUB_LOST", "CUDART_STUB_DEVICE_COUNT"]:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def nvml_reports(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """Set what the NVML stub reports from the next nvmlInit on (NVML_STUB_* variables)."""

    def report(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return report


@pytest.fixture
def old_nvml(stubs: Path, tmp_path: Path) -> Iterator[None]:
    """pynvml over the NVML of a driver without nvmlDeviceGetTemperatureV."""
    with pynvml_over(stubs / "nvml-no-temperature-v" / SONAME, tmp_path):
        yield


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    return write_mlp(tmp_path / "mlp" / "1" / "model.onnx")
