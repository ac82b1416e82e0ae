"""GPU readings, metrics, memory totals and placement through real pynvml over the NVML stub.

NVML reports two boards (``TWO_GPUS``). CUDA sees them too, in the same order or the other,
where a test says so (``HostCuda``, in place of cuda-bindings' device queries); otherwise CUDA
sees none, as the stub driver says: the machine of audit F6, where NVML lists GPUs this
process cannot use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from batchserve.backends.selection import gpu_unusable
from batchserve.core.budgets import parse_budgets
from batchserve.core.device import CPU
from batchserve.devices.nvml import GpuMonitor, GpuReading
from batchserve.devices.placement import gpu_count, resolve_devices
from batchserve.models.memory_probe import device_total_bytes, gpu_total_bytes
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.placing import placements
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.observability.exposition import render
from batchserve.runtime.metrics_collector import (
    GPU_METRICS,
    ServerCollector,
    gpu_families,
    metrics_registry,
)
from batchserve.runtime.triton_metrics import gpu_families as triton_gpu_families
from batchserve.scheduler.memory import MemoryBudgets
from cuda.bindings import runtime as cudart
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.gpu_contract.conftest import TWO_GPUS
from tests.gpu_contract.host_cuda import HostCuda, SimulatedGpu
from tests.gpu_contract.models import CONFIG

NVML_UUIDS = TWO_GPUS["NVML_STUB_UUIDS"].split(",")
Report = Callable[[dict[str, str]], None]


def _raw(uuid: str) -> bytes:
    return bytes.fromhex(uuid.removeprefix("GPU-").replace("-", ""))


@pytest.fixture
def cuda_sees(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], HostCuda]:
    """Make CUDA see the GPUs with these NVML UUIDs, in this order."""

    def see(uuids: list[str]) -> HostCuda:
        gpus = [SimulatedGpu(_raw(uuid), pci_bus=i) for i, uuid in enumerate(uuids)]
        return HostCuda(cudart, gpus).install(monkeypatch)

    return see


@pytest.fixture
def monitor(
    nvml_reports: Report, cuda_sees: Callable[[list[str]], HostCuda]
) -> Iterator[GpuMonitor]:
    nvml_reports(TWO_GPUS)
    cuda_sees(NVML_UUIDS)
    opened = GpuMonitor.open()
    assert opened is not None
    yield opened
    opened.close()


def test_every_gpu_is_read_in_base_units(monitor: GpuMonitor) -> None:
    first, second = monitor.read()
    assert first == GpuReading(
        index=0,
        name="NVIDIA A10G",
        uuid=NVML_UUIDS[0],
        memory_used_bytes=1 << 30,
        memory_total_bytes=24 << 30,
        utilization_ratio=0.37,
        temperature_celsius=54.0,
        power_watts=61.25,
        power_limit_watts=300.0,
        energy_joules=1.25,  # one reading of 1,250 mJ more since the monitor opened
    )
    assert type(first.temperature_celsius) is float
    assert (second.index, second.name, second.uuid) == (1, "Tesla T4", NVML_UUIDS[1])
    assert second.power_watts is None  # the board has no power sensor
    assert (second.power_limit_watts, second.energy_joules) == (None, None)
    assert second.temperature_celsius == 47.0


def test_an_old_driver_without_temperature_v_is_read_too(
    old_nvml: None, monitor: GpuMonitor
) -> None:
    readings = monitor.read()
    assert [r.temperature_celsius for r in readings] == [54.0, 47.0]
    assert all(type(r.temperature_celsius) is float for r in readings)


def test_readings_are_numbered_as_cuda_numbers_the_gpus(
    nvml_reports: Report, cuda_sees: Callable[[list[str]], HostCuda]
) -> None:
    nvml_reports(TWO_GPUS)
    cuda_sees(NVML_UUIDS[::-1])
    monitor = GpuMonitor.open()
    assert monitor is not None
    try:
        readings = monitor.read()
    finally:
        monitor.close()
    assert [(r.index, r.name, r.uuid) for r in readings] == [
        (0, "Tesla T4", NVML_UUIDS[1]),
        (1, "NVIDIA A10G", NVML_UUIDS[0]),
    ]


def test_without_a_driver_there_is_no_monitor_and_one_log_line(
    nvml_reports: Report, caplog: pytest.LogCaptureFixture
) -> None:
    nvml_reports({"NVML_STUB_GPUS": "driver-not-loaded"})
    with caplog.at_level(logging.INFO, logger="batchserve"):
        assert GpuMonitor.open() is None
    records = [r for r in caplog.records if r.name == "batchserve.devices.nvml"]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].getMessage().startswith("GPU metrics off")


def test_the_gpu_families_render(monitor: GpuMonitor) -> None:
    samples = {
        (s.name, s.labels["device"]): s.value
        for family in gpu_families(monitor.read())
        for s in family.samples
    }
    assert samples[("batchserve_gpu_temperature_celsius", "gpu:0")] == 54.0
    assert samples[("batchserve_gpu_power_watts", "gpu:0")] == 61.25
    assert ("batchserve_gpu_power_watts", "gpu:1") not in samples
    assert {name for name, _ in samples} == set(GPU_METRICS)


def test_a_scrape_of_the_metrics_endpoint_carries_the_gpu_series(
    monitor: GpuMonitor, tmp_path: Path
) -> None:
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(tmp_path), 16, budgets)
    text = generate_latest(metrics_registry(ServerCollector(registry, monitor))).decode()
    samples = {
        (s.name, s.labels.get("device")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("batchserve_gpu_memory_total_bytes", "gpu:0")] == 24 << 30
    assert samples[("batchserve_gpu_utilization_ratio", "gpu:1")] == 0.05
    assert samples[("batchserve_gpu_temperature_celsius", "gpu:1")] == 47.0


def test_tritons_gpu_series_name_the_gpus_cuda_sees_by_uuid(
    nvml_reports: Report, cuda_sees: Callable[[list[str]], HostCuda]
) -> None:
    """Model Analyzer refuses a server whose ``nv_gpu_utilization`` lists other GPUs than
    the ones it profiles on (CUDA's visible ones): here CUDA sees the second board alone."""
    nvml_reports(TWO_GPUS)
    cuda_sees([NVML_UUIDS[1]])
    monitor = GpuMonitor.open()
    assert monitor is not None
    try:
        text = render(triton_gpu_families(monitor.read()))
    finally:
        monitor.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    listed = [s.labels["gpu_uuid"] for s in families["nv_gpu_utilization"].samples]
    assert listed == [NVML_UUIDS[1]]
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="{NVML_UUIDS[1]}"}} {16 << 30}\n' in text
    assert "nv_gpu_power_usage" not in families  # that board has no power sensor


@pytest.mark.parametrize(
    ("order", "totals"), [(1, (24 << 30, 16 << 30)), (-1, (16 << 30, 24 << 30))]
)
def test_memory_totals_are_read_for_the_gpu_cuda_means(
    order: int,
    totals: tuple[int, int],
    nvml_reports: Report,
    cuda_sees: Callable[[list[str]], HostCuda],
) -> None:
    nvml_reports(TWO_GPUS)
    cuda_sees(NVML_UUIDS[::order])
    assert (gpu_total_bytes(0), gpu_total_bytes(1)) == totals


def test_placement_follows_cuda_not_nvml(nvml_reports: Report) -> None:
    """NVML lists two boards, but CUDA (the stub driver) can use none: audit F6."""
    nvml_reports(TWO_GPUS)
    assert gpu_count() == 0
    assert resolve_devices(parse_pbtxt(CONFIG), gpu_count()) == [CPU]


def test_placement_counts_the_gpus_cuda_sees(
    nvml_reports: Report, cuda_sees: Callable[[list[str]], HostCuda]
) -> None:
    nvml_reports(TWO_GPUS)
    cuda_sees(NVML_UUIDS)
    assert gpu_count() == 2


def test_an_onnx_model_left_to_the_server_goes_to_the_gpus_onnxruntime_gpu_can_use(
    nvml_reports: Report,
    cuda_sees: Callable[[list[str]], HostCuda],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real onnxruntime-gpu lists its CUDA provider, so KIND_AUTO keeps the GPUs CUDA
    sees (the CPU build, which lists none, sends the model to the CPU: ``test_placing``)."""
    nvml_reports(TWO_GPUS)
    cuda_sees(NVML_UUIDS)
    assert gpu_unusable(parse_pbtxt(CONFIG), Path("model.onnx")) == ""
    with caplog.at_level(logging.WARNING, logger="batchserve.models.placing"):
        found = placements(parse_pbtxt(CONFIG), Path("model.onnx"))
    assert [str(p.device) for p in found] == ["gpu:0", "gpu:1"]
    assert caplog.text == ""
