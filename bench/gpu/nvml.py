"""NVML readings for the check: which GPU and driver, and device memory in use over time.

Device-wide used memory is what NVML knows (every process's allocations and contexts), so a
served model's figure is the growth over a reading taken just before its server started.
Without NVML (the CPU dry run, or no driver) every reading is None.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

SAMPLE_S = 0.1


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_bytes: int
    driver: str
    cuda: str  # the newest CUDA the driver supports

    def line(self) -> str:
        return (
            f"GPU: {self.name}, {self.memory_bytes / 2**30:.1f} GiB; driver {self.driver}, "
            f"CUDA {self.cuda} (driver)"
        )


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version (e.g. 13000) as "13.0"."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def gpu_info(index: int = 0) -> GpuInfo | None:
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        if nvml.nvmlDeviceGetCount() <= index:
            return None
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        driver = nvml.nvmlSystemGetDriverVersion()
        return GpuInfo(
            name.decode() if isinstance(name, bytes) else str(name),
            int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            driver.decode() if isinstance(driver, bytes) else str(driver),
            cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion_v2())),
        )
    finally:
        nvml.nvmlShutdown()


class UsedMemory:
    """Device ``index``'s used bytes, read now and sampled on a thread while open."""

    def __init__(self, index: int = 0) -> None:
        self._nvml = _nvml()
        self._handle = None
        if self._nvml is not None and self._nvml.nvmlDeviceGetCount() > index:
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def read(self) -> int | None:
        if self._nvml is None or self._handle is None:
            return None
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            used = self.read()
            if used is not None:
                self.peak = max(self.peak or 0, used)

    def __enter__(self) -> UsedMemory:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
