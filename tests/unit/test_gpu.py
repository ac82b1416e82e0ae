"""GPU metrics through NVML: absent (and said once) without a GPU, real readings with one.

Readings go through real pynvml (nvidia-ml-py) over the NVML stub (``tests/stubs``), compiled
here with ``cc``: pynvml's own structures, error classes and unit conversions are what the
monitor is tested against, for a current driver and for one without nvmlDeviceGetTemperatureV.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from batchserve.devices import placement
from batchserve.devices.nvml import SCRAPE_SECONDS, GpuMonitor
from batchserve.devices.placement import gpu_count
from batchserve.runtime.metrics_collector import GPU_METRICS, gpu_families
from batchserve.runtime.triton_metrics import gpu_families as triton_gpu_families

from tests.stubs.nvml import build_nvml_stub, pynvml_over

no_gpu = pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
needs_gpu = pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU")

# Two boards: the first reports everything, the second has no power sensor.
TWO_BOARDS = {
    "NVML_STUB_GPUS": "2",
    "NVML_STUB_NAMES": "NVIDIA A10G,Tesla T4",
    "NVML_STUB_UUIDS": "GPU-0,GPU-1",
    "NVML_STUB_MEMORY_TOTAL": f"{16 * 2**30},{16 * 2**30}",
    "NVML_STUB_MEMORY_USED": f"{2**30},{2 * 2**30}",
    "NVML_STUB_UTILIZATION": "37,12",
    "NVML_STUB_TEMPERATURE": "54,47",
    "NVML_STUB_POWER_MW": "61250,-",
    "NVML_STUB_POWER_LIMIT_MW": "300000,-",
    "NVML_STUB_ENERGY_MJ": "5000000,-",
    "NVML_STUB_ENERGY_STEP_MJ": "2500",
}


@pytest.fixture(scope="session")
def nvml_libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stub built as a current driver's NVML and as one before nvmlDeviceGetTemperatureV."""
    root = tmp_path_factory.mktemp("nvml")
    return {
        "current": build_nvml_stub(root / "current"),
        "old": build_nvml_stub(root / "old", temperature_v=False),
    }


def _nvml(library: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for name, value in TWO_BOARDS.items():
        monkeypatch.setenv(name, value)
    with pynvml_over(library, scratch) as pynvml:
        pynvml.nvmlInit()
        yield pynvml


@pytest.fixture
def nvml(
    nvml_libraries: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """pynvml, initialised, over the current driver's NVML with TWO_BOARDS."""
    yield from _nvml(nvml_libraries["current"], tmp_path, monkeypatch)


@pytest.fixture
def old_nvml(
    nvml_libraries: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The same boards behind an NVML without nvmlDeviceGetTemperatureV."""
    yield from _nvml(nvml_libraries["old"], tmp_path, monkeypatch)


def _monitor(nvml: ModuleType, clock: Callable[[], float] | None = None) -> GpuMonitor:
    """A monitor of the two boards; by default each read is a second after the last (fresh)."""
    ticks = itertools.count()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    return GpuMonitor(nvml, handles, clock or (lambda: float(next(ticks))))


def _reconfigure(nvml: ModuleType) -> None:
    """The stub reads its environment at nvmlInit; the count of inits stays balanced."""
    nvml.nvmlInit()
    nvml.nvmlShutdown()


@no_gpu
def test_without_a_gpu_there_is_no_monitor_and_the_log_says_why_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="batchserve.devices.nvml"):
        assert GpuMonitor.open() is None
    records = [r for r in caplog.records if r.name == "batchserve.devices.nvml"]
    assert len(records) == 1
    assert records[0].getMessage().startswith("GPU metrics off: ")
    assert "NVML" in records[0].getMessage()


def test_gpu_metrics_turned_off_open_no_monitor_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="batchserve.devices.nvml"):
        assert GpuMonitor.open(allowed=False) is None
    said = [r.getMessage() for r in caplog.records if r.name == "batchserve.devices.nvml"]
    assert said == ["GPU metrics off: turned off (--allow-gpu-metrics false)"]


def test_readings_are_converted_to_base_units_and_unsupported_ones_left_out(
    nvml: ModuleType,
) -> None:
    first, second = _monitor(nvml).read()
    assert (first.name, first.uuid) == ("NVIDIA A10G", "GPU-0")
    assert (first.memory_used_bytes, first.memory_total_bytes) == (2**30, 16 * 2**30)
    assert first.utilization_ratio == 0.37
    assert first.power_watts == 61.25
    assert first.temperature_celsius == 54
    assert type(first.temperature_celsius) is float
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


def test_power_limit_and_energy_since_the_monitor_opened(nvml: ModuleType) -> None:
    monitor = _monitor(nvml)  # reads each board's energy once, as it opens
    first, second = monitor.read()
    assert first.power_limit_watts == 300
    assert first.energy_joules == 2.5  # one reading of 2,500 mJ more since the monitor opened
    assert (second.power_limit_watts, second.energy_joules) == (None, None)  # not supported
    assert monitor.read()[0].energy_joules == 5


def test_one_scrape_reads_each_board_once(nvml: ModuleType) -> None:
    """batchserve's and Triton's GPU series are written from one reading per scrape: a second
    read within SCRAPE_SECONDS is the first again (the energy count did not advance)."""
    now = [100.0]
    monitor = _monitor(nvml, lambda: now[0])
    first = monitor.read()
    now[0] += SCRAPE_SECONDS / 2
    assert monitor.read() is first
    now[0] += SCRAPE_SECONDS
    assert monitor.read()[0].energy_joules == 5


def test_tritons_gpu_families_label_each_board_with_its_uuid(nvml: ModuleType) -> None:
    samples = {
        (family.name, labels["gpu_uuid"]): value
        for family in triton_gpu_families(_monitor(nvml).read())
        for labels, value in family.samples
    }
    assert samples == {
        ("nv_gpu_utilization", "GPU-0"): 0.37,
        ("nv_gpu_utilization", "GPU-1"): 0.12,
        ("nv_gpu_memory_total_bytes", "GPU-0"): 16 * 2**30,
        ("nv_gpu_memory_total_bytes", "GPU-1"): 16 * 2**30,
        ("nv_gpu_memory_used_bytes", "GPU-0"): 2**30,
        ("nv_gpu_memory_used_bytes", "GPU-1"): 2 * 2**30,
        ("nv_gpu_power_usage", "GPU-0"): 61.25,  # the second board reports no power
        ("nv_gpu_power_limit", "GPU-0"): 300,
        ("nv_energy_consumption", "GPU-0"): 2.5,
    }


def test_an_old_driver_without_temperature_v_is_read_with_the_older_call(
    old_nvml: ModuleType,
) -> None:
    handle = old_nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(old_nvml.NVMLError_FunctionNotFound):
        old_nvml.nvmlDeviceGetTemperatureV(handle, old_nvml.NVML_TEMPERATURE_GPU)
    readings = _monitor(old_nvml).read()
    assert [r.temperature_celsius for r in readings] == [54, 47]
    assert all(type(r.temperature_celsius) is float for r in readings)


def test_a_gpu_that_stops_answering_is_left_out_and_logged_once(
    nvml: ModuleType, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monitor = _monitor(nvml)
    monkeypatch.setenv("NVML_STUB_LOST", "1")
    _reconfigure(nvml)
    with caplog.at_level(logging.WARNING, logger="batchserve.devices.nvml"):
        assert [r.index for r in monitor.read()] == [0]
        assert [r.index for r in monitor.read()] == [0]
    assert len(caplog.records) == 1
    monkeypatch.delenv("NVML_STUB_LOST")
    _reconfigure(nvml)
    assert [r.index for r in monitor.read()] == [0, 1]
    monitor.close()
    with pytest.raises(nvml.NVMLError_Uninitialized):  # close() shut NVML down
        nvml.nvmlShutdown()


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


def test_without_nvidias_driver_cuda_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver library, no device: cuda-python is neither imported nor asked (it cost 70-90
    ms of each server start on a CPU-only host). Where the library loads, CUDA decides."""
    asked: list[str] = []
    monkeypatch.setattr(placement, "_cuda_runtime", lambda: asked.append("cuda"))
    monkeypatch.setattr(placement, "DRIVER_LIBRARY", "libcuda-absent-for-this-test.so.1")
    assert placement.gpu_count() == 0
    assert asked == []
    monkeypatch.setattr(placement, "DRIVER_LIBRARY", "libc.so.6")  # a library that loads
    placement.gpu_count()
    assert asked == ["cuda"]
