"""GPU metrics through NVML: absent (and said once) without a GPU, real readings with one."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from batchserve.devices import gpu_count
from batchserve.gpu import GpuMonitor
from batchserve.metrics_collector import GPU_METRICS, gpu_families

no_gpu = pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
needs_gpu = pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU")


@no_gpu
def test_without_a_gpu_there_is_no_monitor_and_the_log_says_why_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="batchserve.gpu"):
        assert GpuMonitor.open() is None
    records = [r for r in caplog.records if r.name == "batchserve.gpu"]
    assert len(records) == 1
    assert records[0].getMessage().startswith("GPU metrics off: ")
    assert "NVML" in records[0].getMessage()


class _NvmlError(Exception):
    pass


class _NotSupported(_NvmlError):
    pass


class _FunctionNotFound(_NvmlError):
    pass


class _Nvml:
    """NVML's Python surface as nvidia-ml-py exposes it, for two boards: the first reports
    everything, the second has no power sensor and an old driver (no TemperatureV)."""

    NVMLError = _NvmlError
    NVMLError_NotSupported = _NotSupported
    NVMLError_FunctionNotFound = _FunctionNotFound
    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.lost: set[int] = set()
        self.shut_down = False

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return b"NVIDIA A10G" if handle == 0 else b"Tesla T4"

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        if handle in self.lost:
            raise _NvmlError("GPU is lost")
        return SimpleNamespace(used=(handle + 1) * 2**30, total=16 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        if handle == 1:
            raise _NotSupported("Not Supported")
        return 61_250

    def nvmlDeviceGetTemperatureV(self, handle: int, sensor: int) -> Any:  # noqa: N802
        if handle == 1:
            raise _FunctionNotFound("Function Not Found")
        return SimpleNamespace(temperature=54)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return 47

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut_down = True


def test_readings_are_converted_to_base_units_and_unsupported_ones_left_out() -> None:
    nvml = _Nvml()
    first, second = GpuMonitor(nvml, [0, 1]).read()
    assert (first.name, first.uuid) == ("NVIDIA A10G", "GPU-0")
    assert (first.memory_used_bytes, first.memory_total_bytes) == (2**30, 16 * 2**30)
    assert first.utilization_ratio == 0.37
    assert first.power_watts == 61.25
    assert first.temperature_celsius == 54
    assert second.power_watts is None
    assert second.temperature_celsius == 47
    samples = {
        (s.name, s.labels["device"]): s.value
        for family in gpu_families([first, second])
        for s in family.samples
    }
    assert samples[("batchserve_gpu_power_watts", "gpu:0")] == 61.25
    assert ("batchserve_gpu_power_watts", "gpu:1") not in samples
    assert samples[("batchserve_gpu_memory_used_bytes", "gpu:1")] == 2 * 2**30
    assert {name for name, _ in samples} == set(GPU_METRICS)


def test_a_gpu_that_stops_answering_is_left_out_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = _Nvml()
    monitor = GpuMonitor(nvml, [0, 1])
    nvml.lost.add(1)
    with caplog.at_level(logging.WARNING, logger="batchserve.gpu"):
        assert [r.index for r in monitor.read()] == [0]
        assert [r.index for r in monitor.read()] == [0]
    assert len(caplog.records) == 1
    nvml.lost.clear()
    assert [r.index for r in monitor.read()] == [0, 1]
    monitor.close()
    assert nvml.shut_down


@pytest.mark.gpu
@needs_gpu
def test_nvml_reads_every_gpu_of_this_machine() -> None:
    monitor = GpuMonitor.open()
    assert monitor is not None
    try:
        readings = monitor.read()
    finally:
        monitor.close()
    assert [r.index for r in readings] == list(range(gpu_count()))
    for reading in readings:
        assert 0 < reading.memory_used_bytes <= reading.memory_total_bytes
        assert reading.uuid.startswith("GPU-")
        if reading.utilization_ratio is not None:
            assert 0 <= reading.utilization_ratio <= 1
        if reading.temperature_celsius is not None:
            assert 0 < reading.temperature_celsius < 120
