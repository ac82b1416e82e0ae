"""PyTorch backend: a ``torch.export`` program (``model.pt2``) per instance, on the CPU or one GPU.

The archive is read through ``torch_archive`` (nothing in it is unpickled or executed), its
signature through ``torch_program``, and batches run through ``torch_runner`` (on a GPU: the
instance's own stream, pinned staging buffers, CUDA graphs when the config asks); torch's
thread pools are sized once per process (``torch_threads``). torch is
imported only when such a model loads; torch's exceptions become batchserve's in one place,
``map_torch_errors``.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import graph_batch_sizes
from batchserve.backends.onnx_io import IoLayout
from batchserve.backends.torch_archive import import_torch, load_program
from batchserve.backends.torch_program import ProgramLayout, describe
from batchserve.backends.torch_runner import CpuRunner, CudaRunner, ProgramCall, start_meter
from batchserve.backends.torch_threads import fix_thread_counts
from batchserve.core.device import CPU, Device
from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.core.signature import DYNAMIC, ModelSignature
from batchserve.proto.model_config_pb2 import ModelConfig

_log = logging.getLogger(__name__)

_OOM = re.compile(
    r"out of memory|can't allocate memory|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)
# What torch.export's input check says about a shape outside the program's range.
_BAD_INPUT = re.compile(r"^Expected input at |^Guard failed")


def translate_torch_error(
    error: Exception, where: str, *, loading: bool = False
) -> BatchserveError:
    """The batchserve error for an exception torch raised; ``where`` names model or file."""
    message = f"{where}: {type(error).__name__}: {' '.join(str(error).split())[:1000]}"
    torch_oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", MemoryError)
    if isinstance(error, MemoryError | torch_oom) or _OOM.search(str(error)):
        return OutOfMemory(message)
    if not loading and _BAD_INPUT.search(str(error)):
        return InvalidArgument(message)
    return BackendError(message)


@contextmanager
def map_torch_errors(where: str, *, loading: bool = False) -> Iterator[None]:
    """The one boundary where torch's exceptions become batchserve's."""
    try:
        yield
    except BatchserveError:
        raise
    except Exception as exc:
        raise translate_torch_error(exc, where, loading=loading) from exc


class TorchBackend:
    """One ``torch.export`` program on one device."""

    def __init__(self) -> None:
        self._runner: CpuRunner | CudaRunner | None = None
        self._release_next = False
        self._device = CPU
        self._name = ""
        self._signature = ModelSignature((), ())

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes this instance replays as CUDA graphs (empty without graphs)."""
        return () if self._runner is None else self._runner.graph_sizes

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        torch = import_torch(model_file)
        self._name = config.name or model_file.stem
        fix_thread_counts(torch, config, model_file)
        placed = _placement(torch, device, config, model_file)
        sizes = graph_batch_sizes(config, model_file)
        with map_torch_errors(str(model_file), loading=True):
            base = start_meter(torch, placed.index) if placed.kind == "gpu" else 0
            program = load_program(model_file)
            layout = describe(program, model_file)
            _check_batch_limit(layout, config, model_file)
            runner = _runner(torch, program, layout, config, placed, sizes, base)
        self._runner, self._device, self._signature = runner, placed, layout.signature

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        runner = self._runner
        if runner is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        names = list(output_names or (spec.name for spec in self._signature.outputs))
        check_inputs(self._signature, inputs, names, self._name)
        release, self._release_next = self._release_next, False
        with map_torch_errors(f"model '{self._name}'"):
            outputs = runner.run(inputs, names)
            if release:
                runner.release_cached()
            return outputs

    def memory_bytes(self) -> int | None:
        return None if self._runner is None else self._runner.memory_bytes()

    def release_after_next_run(self) -> None:
        self._release_next = True

    def interrupt(self) -> None:
        """A torch forward runs to its end: torch has no way to stop it from outside."""

    def unload(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()


def check_inputs(
    signature: ModelSignature, inputs: Arrays, outputs: Sequence[str], model: str
) -> None:
    """InvalidArgument naming the tensor, before torch sees a wrong name, dtype or shape."""
    expected = {spec.name: spec for spec in signature.inputs}
    unknown = sorted(set(inputs) - set(expected)) + [
        n for n in outputs if signature.output(n) is None
    ]
    missing = sorted(set(expected) - set(inputs))
    if unknown or missing:
        raise InvalidArgument(
            f"model '{model}': the program takes inputs {sorted(expected)} and gives outputs "
            f"{[s.name for s in signature.outputs]}; unknown {unknown}, missing {missing}"
        )
    for name, array in inputs.items():
        spec = expected[name]
        if array.dtype != spec.datatype.numpy:
            raise InvalidArgument(
                f"model '{model}': input '{name}' has numpy dtype {array.dtype}, but the "
                f"program expects {spec.datatype.wire}"
            )
        fits = len(array.shape) == len(spec.shape) and all(
            want in (DYNAMIC, got) for want, got in zip(spec.shape, array.shape, strict=True)
        )
        if not fits:
            shape = [d if d != DYNAMIC else -1 for d in spec.shape]
            raise InvalidArgument(
                f"model '{model}': input '{name}' has shape {list(array.shape)}, but the "
                f"program takes {shape} (-1: any size)"
            )


def _placement(torch: Any, device: Device, config: ModelConfig, model_file: Path) -> Device:
    """The device to run on: the GPU asked for, or the CPU when allowed and no GPU is usable."""
    if device.kind == "cpu":
        return device
    problem = gpu_problem(torch, device.index)
    if not problem:
        return device
    problem = f"the instance is placed on {device}, but {problem}"
    if config.batchserve.allow_cpu_fallback:
        _log.warning("%s: %s; running on the CPU (allow_cpu_fallback)", model_file, problem)
        return CPU
    raise DeviceUnavailable(
        f"{model_file}: {problem}. Install a CUDA build of torch on a machine with an NVIDIA "
        "GPU and driver, or set `batchserve { allow_cpu_fallback: true }` to run on the CPU"
    )


def gpu_problem(torch: Any, index: int) -> str:
    """Why ``torch`` cannot run on CUDA device ``index`` ("" when it can)."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (no driver, or CUDA_VISIBLE_DEVICES hides the GPUs)"
    count = int(torch.cuda.device_count())
    if index >= count:
        return f"torch sees {count} GPU(s)"
    return ""


def _check_batch_limit(layout: ProgramLayout, config: ModelConfig, model_file: Path) -> None:
    limit = layout.batch_limit
    if limit is not None and config.max_batch_size > limit:
        raise ModelConfigError(
            f"{model_file}: the program takes batches of at most {limit} (its batch Dim's "
            f"max), but max_batch_size is {config.max_batch_size}; lower max_batch_size or "
            "re-export with a larger maximum"
        )


def _runner(
    torch: Any,
    program: Any,
    layout: ProgramLayout,
    config: ModelConfig,
    device: Device,
    sizes: tuple[int, ...],
    base: int,
) -> CpuRunner | CudaRunner:
    if device.kind == "cpu":
        if sizes:
            _log.warning("%s: optimization.cuda.graphs is ignored on the CPU", config.name)
        return CpuRunner(ProgramCall(torch, program.module(), layout))
    from torch.export.passes import move_to_device_pass

    moved = move_to_device_pass(program, f"cuda:{device.index}")
    io = IoLayout.plan(layout.signature, config.max_batch_size)
    if sizes and not io.complete:
        _log.warning(
            "%s: optimization.cuda.graphs needs every input and output fixed apart from the "
            "batch axis; running without CUDA graphs",
            config.name,
        )
    call = ProgramCall(torch, moved.module(), layout)
    graphs = sizes if io.complete else ()
    try:
        busy_wait = config.optimization.cuda.busy_wait_events
        return CudaRunner(call, io, device.index, graphs, base, busy_wait)
    except Exception as exc:
        error = translate_torch_error(exc, config.name, loading=True)
        if not graphs or isinstance(error, OutOfMemory):
            raise error from exc
        raise ModelConfigError(
            f"{error.message}; capturing CUDA graphs failed (the program may synchronise with "
            "the host or change shape with its data): set optimization { cuda { graphs: false "
            "} } in config.pbtxt"
        ) from exc
