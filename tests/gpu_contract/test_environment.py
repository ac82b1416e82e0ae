"""The contract virtualenv holds the GPU build of ONNX Runtime alone, loaded over the stubs."""

from __future__ import annotations

import ctypes
import importlib.metadata
from pathlib import Path

import onnxruntime as ort
import pytest


def test_only_the_gpu_build_of_onnxruntime_is_installed() -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("onnxruntime")
    assert importlib.metadata.version("onnxruntime-gpu") == ort.__version__


def test_the_gpu_providers_are_offered() -> None:
    available = ort.get_available_providers()
    assert {"TensorrtExecutionProvider", "CUDAExecutionProvider"} <= set(available)


@pytest.mark.parametrize("soname", ["libcuda.so.1", "libcudart.so.13", "libnvidia-ml.so.1"])
def test_libraries_opened_by_name_are_the_stubs(soname: str, stubs: Path) -> None:
    """A real CUDA install must not shadow the stubs: they come first on the search path."""
    ctypes.CDLL(soname)
    maps = Path("/proc/self/maps").read_text().splitlines()
    assert {line.split()[-1] for line in maps if line.endswith(f"/{soname}")} == {
        str(stubs / soname)
    }


@pytest.mark.parametrize(
    ("soname", "function", "code", "text"),
    [
        ("libcudart.so.13", "cudaGetErrorString", 100, b"no CUDA-capable device is detected"),
        ("libcudart.so.13", "cudaGetErrorName", 100, b"cudaErrorNoDevice"),
        ("libcublas.so.13", "cublasGetStatusString", 1, b"the library was not initialized"),
        ("libcublas.so.13", "cublasGetStatusName", 1, b"CUBLAS_STATUS_NOT_INITIALIZED"),
        ("libcudnn.so.9", "cudnnGetErrorString", 1001, b"CUDNN_STATUS_NOT_INITIALIZED"),
        ("libnvidia-ml.so.1", "nvmlErrorString", 9, b"Driver Not Loaded"),
    ],
)
def test_stub_functions_returning_text_return_real_strings(
    soname: str, function: str, code: int, text: bytes, stubs: Path
) -> None:
    """A generated default (an int) where a pointer is due would crash the caller."""
    returns_text = getattr(ctypes.CDLL(str(stubs / soname)), function)
    returns_text.restype = ctypes.c_char_p
    assert returns_text(code) == text


def test_the_stub_driver_writes_its_error_string_through_the_out_parameter(stubs: Path) -> None:
    text = ctypes.c_char_p()
    assert ctypes.CDLL(str(stubs / "libcuda.so.1")).cuGetErrorString(100, ctypes.byref(text)) == 0
    assert text.value == b"no CUDA-capable device is detected"
