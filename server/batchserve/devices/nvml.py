"""NVIDIA GPU readings through NVML, for the metrics endpoint.

NVML is opened once, when the server starts, and each scrape reads the memory, utilisation,
temperature, power (and its limit) and energy of every GPU this process can run on, labelled
with CUDA's index as instances are (``devices.nvml_handle`` matches NVML's devices to CUDA's).
Without NVML (no driver) or without a GPU there is no monitor at all and the log says why,
once: the GPU series are then absent, never zero. A reading one board does not support (power
on some) is left out for that board alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from batchserve.devices.placement import gpu_count, nvml_handle

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
SCRAPE_SECONDS = 0.2
"""Readings this recent are reused: one scrape writes batchserve's and Triton's GPU series
from one reading of each board (an energy count read twice would advance twice)."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one scrape; None where the board does not report that figure.

    Args:
        index: CUDA's index, as in ``Device("gpu", index)`` (NVML's may differ).
        name: product name, e.g. ``NVIDIA A10G``.
        uuid: NVML's stable identifier (indices can change between boots).
        memory_used_bytes: device memory in use, by every process.
        memory_total_bytes: device memory installed.
        utilization_ratio: share of the last sample period a kernel was running (0..1).
        temperature_celsius: core temperature.
        power_watts: board power draw.
        power_limit_watts: the power management limit.
        energy_joules: energy the board used since the monitor opened (since the server
            started), as Triton reports it.
    """

    index: int
    name: str
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_ratio: float | None
    temperature_celsius: float | None
    power_watts: float | None
    power_limit_watts: float | None = None
    energy_joules: float | None = None


class GpuMonitor:
    """Open NVML handles of every GPU; ``read`` is called at scrape time."""

    def __init__(
        self, nvml: Any, handles: list[Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._handles = handles
        self._names = [_text(nvml.nvmlDeviceGetName(h)) for h in handles]
        self._uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        self._energy_at_open = [self._optional(partial(self._energy_mj, h)) for h in handles]
        self._failing: set[int] = set()
        self._last: tuple[float, list[GpuReading]] | None = None

    @classmethod
    def open(cls, allowed: bool = True) -> GpuMonitor | None:
        """The monitor, or None (logged once, with the reason) where NVML or GPUs are missing
        or GPU metrics are not ``allowed``."""
        if not allowed:
            _log_absent("turned off (--allow-gpu-metrics false)")
            return None
        try:
            import pynvml
        except ImportError:  # pragma: no cover - nvidia-ml-py is a base dependency
            _log_absent("nvidia-ml-py is not installed")
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _log_absent(f"NVML cannot start ({exc}): no NVIDIA driver is visible")
            return None
        count = gpu_count()
        if count == 0:
            pynvml.nvmlShutdown()
            _log_absent("no GPU is visible to CUDA in this process")
            return None
        monitor = cls(pynvml, [nvml_handle(pynvml, index) for index in range(count)])
        logger.info("GPU metrics on", extra={"gpus": monitor._names})
        return monitor

    def read(self) -> list[GpuReading]:
        """Every GPU that answers; one that stops answering is logged once and left out.
        Readings taken within ``SCRAPE_SECONDS`` are returned again."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < SCRAPE_SECONDS:
            return self._last[1]
        readings = self._read_all()
        self._last = (now, readings)
        return readings

    def _read_all(self) -> list[GpuReading]:
        readings = []
        for index, handle in enumerate(self._handles):
            try:
                readings.append(self._read(index, handle))
            except self._nvml.NVMLError as exc:
                if index not in self._failing:
                    self._failing.add(index)
                    logger.warning(
                        "GPU stopped answering NVML", extra={"gpu": index, "reason": str(exc)}
                    )
                continue
            self._failing.discard(index)
        return readings

    def _read(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
        power = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
        limit = self._optional(lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000)
        energy = self._optional(partial(self._energy_mj, handle))
        at_open = self._energy_at_open[index]
        return GpuReading(
            index=index,
            name=self._names[index],
            uuid=self._uuids[index],
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            utilization_ratio=utilization,
            temperature_celsius=self._optional(lambda: self._temperature(handle)),
            power_watts=power,
            power_limit_watts=limit,
            energy_joules=None if energy is None or at_open is None else (energy - at_open) / 1000,
        )

    def _energy_mj(self, handle: Any) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def _temperature(self, handle: Any) -> float:
        nvml = self._nvml
        try:  # nvidia-ml-py returns the reading itself, an int, not the versioned struct
            return float(nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU))
        except nvml.NVMLError_FunctionNotFound:  # drivers older than the V call
            return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

    def _optional(self, read: Callable[[], _T]) -> _T | None:
        try:
            return read()
        except self._nvml.NVMLError_NotSupported:
            return None

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _log_absent(reason: str) -> None:
    logger.info("GPU metrics off: %s", reason, extra={"reason": reason})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
