"""Real pynvml over the NVML stub (``nvml_stub.c``), compiled with ``cc`` in well under a second.

pynvml loads ``libnvidia-ml.so.1`` into its module global ``nvmlLib`` on the first
``nvmlInit`` unless one is there already, and caches each function it looks up by name. So
setting the global to the stub, with an empty cache, makes every pynvml call answer from the
stub without touching the dynamic loader's search path. What the stub's GPUs report is set
with ``NVML_STUB_*`` environment variables, read at each ``nvmlInit`` (see the C file).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("nvml_stub.c")
SONAME = "libnvidia-ml.so.1"


def build_nvml_stub(out_dir: Path, *, temperature_v: bool = True) -> Path:
    """Compile the stub into ``out_dir``; without ``temperature_v`` it is an old driver's NVML."""
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / SONAME
    flags = [] if temperature_v else ["-DNVML_STUB_NO_TEMPERATURE_V"]
    command = ["cc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags, f"-Wl,-soname,{SONAME}"]
    subprocess.run([*command, "-o", str(library), str(SOURCE)], check=True)
    return library


def build_driver_stub(out_dir: Path) -> Path:
    """An empty ``libcuda.so.1`` in ``out_dir``: a host with NVIDIA's driver has it beside
    NVML, and the server looks for it before asking CUDA for GPUs (``gpu_count``). Nothing in
    it is called where cuda-python is absent: NVML then counts the GPUs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / "libcuda.so.1"
    command = ["cc", "-shared", "-fPIC", "-x", "c", "-", "-Wl,-soname,libcuda.so.1"]
    subprocess.run([*command, "-o", str(library)], input=b"", check=True)
    return library


@contextmanager
def pynvml_over(library: Path, scratch: Path) -> Iterator[ModuleType]:
    """pynvml answering from a fresh copy of ``library``, as it was again afterwards.

    The copy gets its own name so the stub's state (initialisation count) starts afresh:
    the loader would hand back an already loaded library for the same path.
    """
    import pynvml

    scratch.mkdir(parents=True, exist_ok=True)
    copy = Path(shutil.copy(library, scratch / f"{library.parent.name}-{SONAME}"))
    saved = pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache
    pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache = ctypes.CDLL(str(copy)), {}
    try:
        yield pynvml
    finally:
        pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache = saved
