"""Before anything is installed: is this a machine `make gpu-check` can run on?

Run by ``scripts/gpu_check.sh`` with the machine's own Python and the standard library only:
NVIDIA's management library is opened with ctypes, so the answer needs no package. Each
missing piece is named, and the exit status is 1 when any is missing.

    python3 -m bench.gpu.preflight
"""

from __future__ import annotations

import ctypes
import shutil
import sys

PYTHONS = ((3, 11), (3, 12))
NVML = "libnvidia-ml.so.1"


def problems(python: tuple[int, int], gpus: int, nvml_error: str, smi: bool) -> list[str]:
    """What is missing, one sentence each (empty: the machine will do)."""
    found = []
    if python not in PYTHONS:
        wanted = " or ".join(f"{major}.{minor}" for major, minor in PYTHONS)
        found.append(
            f"Python {python[0]}.{python[1]}: the check runs on {wanted} "
            "(set GPU_CHECK_PYTHON to such an interpreter)"
        )
    if nvml_error:
        where = "nvidia-smi is on the PATH, but " if smi else "no nvidia-smi on the PATH, and "
        found.append(f"no NVIDIA driver: {where}{nvml_error}")
    elif gpus == 0:
        found.append("the NVIDIA driver sees no GPU (NVML reports 0 devices)")
    return found


def nvml_devices() -> tuple[int, str]:
    """(GPUs NVML counts, "") or (0, why NVML could not be asked)."""
    try:
        nvml = ctypes.CDLL(NVML)
    except OSError as exc:
        return 0, f"{NVML} cannot be loaded ({exc})"
    if nvml.nvmlInit_v2() != 0:
        return 0, "nvmlInit failed: the driver is not loaded or no device is exposed"
    count = ctypes.c_uint(0)
    try:
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return 0, "nvmlDeviceGetCount failed"
    finally:
        nvml.nvmlShutdown()
    return int(count.value), ""


def main() -> int:
    gpus, error = nvml_devices()
    python = (sys.version_info.major, sys.version_info.minor)
    found = problems(python, gpus, error, shutil.which("nvidia-smi") is not None)
    if found:
        print("gpu-check: this machine cannot run the GPU check:", file=sys.stderr)
        for problem in found:
            print(f"  - {problem}", file=sys.stderr)
        print("  (GPU_CHECK_CPU=1 make gpu-check runs the CPU dry run instead)", file=sys.stderr)
        return 1
    print(f"gpu-check: Python {python[0]}.{python[1]}, {gpus} GPU(s) visible to NVML")
    return 0


if __name__ == "__main__":
    sys.exit(main())
