"""ONNX Runtime backend: one InferenceSession per instance, on the CPU or one GPU.

Execution providers and session options are chosen in ``onnx_options``, the GPU's stream and
CUDA graphs in ``onnx_gpu``, the session itself in ``onnx_session``; on a GPU, batches go
through ``onnx_io`` (buffers sized once, the instance's own CUDA stream, CUDA graphs when the
config asks). ORT's exceptions become batchserve's errors in one place, ``onnx_errors``.
An instance is opened in one step, ``_open_instance``: ready, or nothing of it left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from batchserve.backends.base import Arrays
from batchserve.backends.onnx_errors import map_ort_errors
from batchserve.backends.onnx_gpu import GpuSetup, graph_hint
from batchserve.backends.onnx_io import BoundRunner, HostMemory, IoLayout, Memory
from batchserve.backends.onnx_options import choose_providers
from batchserve.backends.onnx_session import make_cache_dirs, open_session, session_signature
from batchserve.backends.onnx_stop import RunStopper
from batchserve.core.datatypes import BYTES, DataType
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BackendError, InvalidArgument
from batchserve.core.signature import ModelSignature
from batchserve.proto.model_config_pb2 import ModelConfig

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Instance:
    """A ready instance: its session, what it computes, where, and the I/O it binds through.

    Args:
        memory: the buffers (and, on a GPU, the stream) the session runs on; outlives it.
        runner: the I/O binding over ``memory``, or None when batches go through ``run``.
    """

    session: Any
    signature: ModelSignature
    device: Device
    memory: Memory
    runner: BoundRunner | None


def _open_instance(
    model_file: Path,
    config: ModelConfig,
    device: Device,
    *,
    name: str,
    memory_limit: int | None,
    io_binding: bool | None,
) -> _Instance:
    """The session with its stream, buffers and CUDA graphs, built in one step.

    Everything built registers its release on ``rollback``; any failure unwinds it (runner,
    then buffers, then stream, as ``unload`` does) and goes on as the error it was.
    """
    plan = choose_providers(
        ort.get_available_providers(),
        config,
        device,
        model_file=model_file,
        memory_limit_bytes=memory_limit,
    )
    with ExitStack() as rollback:
        setup = GpuSetup.open(plan, config, model_file, io_binding is not False, rollback)
        make_cache_dirs(setup.plan)
        cpu_limit = memory_limit if setup.plan.device.kind == "cpu" else None
        with (
            graph_hint(setup.graph_sizes, model_file),
            map_ort_errors(str(model_file), loading=True),
        ):
            session, plan = open_session(model_file, config, setup.plan, cpu_limit)
        for warning in (*plan.warnings, *setup.warnings):
            _log.warning(warning)
        on_gpu = plan.device.kind == "gpu"
        memory = setup.memory if on_gpu else HostMemory()
        if memory is not setup.memory:
            rollback.callback(memory.close)
        signature = session_signature(session, model_file)
        runner = None
        where = f"model '{name}'"
        if io_binding or (io_binding is None and on_gpu):
            layout = IoLayout.plan(signature, config.max_batch_size)
            sizes = setup.graph_sizes if on_gpu else ()
            with graph_hint(setup.graph_sizes, model_file), map_ort_errors(where):
                runner = BoundRunner(session, layout, memory, _run_options, sizes, where)
                rollback.callback(runner.close)
                runner.capture_graphs()
        elif (layout := IoLayout.plan(signature, 0)).bf16:
            # ``session.run`` types inputs by numpy dtype, and numpy has no bfloat16: bind
            # per batch, from and to host memory, as ``run`` does.
            runner = BoundRunner(session, layout, HostMemory(), _run_options, (), where)
        rollback.pop_all()
    if memory is not setup.memory:  # fell back to the CPU: the GPU stream is not needed
        setup.memory.close()
    return _Instance(session, signature, plan.device, memory, runner)


class OnnxBackend:
    """One ONNX Runtime session on one device.

    Args:
        memory_limit_bytes: cap on the session's memory arena: ``gpu_mem_limit`` on a GPU, an
            environment-registered CPU arena (``OrtArenaCfg.max_mem``) on the CPU. The I/O
            buffers ``onnx_io`` allocates once per GPU instance sit outside that arena.
        io_binding: bind inputs and outputs explicitly; None means on GPUs only. A model
            with a BF16 tensor is bound per batch whatever this says (``onnx_bf16``).
    """

    def __init__(
        self, *, memory_limit_bytes: int | None = None, io_binding: bool | None = None
    ) -> None:
        self._memory_limit = memory_limit_bytes
        self._io_binding = io_binding
        self._session: Any = None
        self._runner: BoundRunner | None = None
        self._memory: Memory = HostMemory()
        self._device = CPU
        self._name = ""
        self._signature = ModelSignature((), ())
        self._run_options = _run_options()
        self._next_options: Any = None
        """Options for the next run only (``release_after_next_run``)."""
        self._stopper = RunStopper()

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes this instance runs as captured CUDA graphs (empty without graphs)."""
        return () if self._runner is None else self._runner.graph_sizes

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        """Open the instance in one step; on failure nothing of it is kept (``_open_instance``)."""
        self._name = config.name or model_file.stem
        instance = _open_instance(
            model_file,
            config,
            device,
            name=self._name,
            memory_limit=self._memory_limit,
            io_binding=self._io_binding,
        )
        self._session, self._runner, self._memory = (
            instance.session,
            instance.runner,
            instance.memory,
        )
        self._signature, self._device = instance.signature, instance.device

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        names = list(output_names or (spec.name for spec in self._signature.outputs))
        self._check_dtypes(inputs)
        inputs = self._as_text(inputs)
        options, self._next_options = self._next_options, None
        with map_ort_errors(f"model '{self._name}'"):
            if self._runner is not None:
                arrays = self._runner.run(inputs, names, options, self._stopper)
            else:
                options = options or self._run_options
                with self._stopper.running(options):
                    arrays = session.run(names, dict(inputs), options)
        return dict(zip(names, arrays, strict=True))

    def memory_bytes(self) -> int | None:
        """None: ORT does not report its arenas (device measurement belongs to the caller)."""
        return None

    def release_after_next_run(self) -> None:
        """ORT's arena keeps what a run took: one 2048 x 2048 image left a small CNN's
        process 1.1 GiB larger, and a second 1.0 GiB more. The run option that shrinks the
        arena after a run brought it back within 80 MiB of its size before; it is not used
        on every run, where reallocating cost a large image twice its time."""
        options = _run_options()
        where = "cpu:0" if self._device.kind == "cpu" else f"gpu:{self._device.index}"
        options.add_run_config_entry(ARENA_SHRINKAGE_KEY, where)
        self._next_options = options

    def interrupt(self) -> None:
        """ORT's ``terminate`` flag on the run in progress (``onnx_stop``)."""
        self._stopper.stop()

    def unload(self) -> None:
        # The session goes first: it may compute on the stream the memory owns.
        runner, self._runner, self._session = self._runner, None, None
        if runner is not None:
            runner.close()
        memory, self._memory = self._memory, HostMemory()
        memory.close()

    def _check_dtypes(self, inputs: Arrays) -> None:
        # ORT's own dtype error does not name the tensor; this does, at no per-element cost.
        for name, array in inputs.items():
            spec = self._signature.input(name)
            if spec is None or _dtype_fits(array.dtype, spec.datatype):
                continue
            raise InvalidArgument(
                f"model '{self._name}': input '{name}' has numpy dtype {array.dtype}, "
                f"but the model expects {spec.datatype.wire}"
            )

    def _as_text(self, inputs: Arrays) -> Arrays:
        """BYTES elements as str: ORT's Python binding turns a bytes object into its repr
        ("b'12'"), which a model parsing its strings then rejects or misreads."""
        strings = [
            name
            for name, array in inputs.items()
            if array.dtype.kind in "OS" and (spec := self._signature.input(name)) is not None
            and spec.datatype is BYTES
        ]  # fmt: skip
        if not strings:
            return inputs
        converted = dict(inputs)
        for name in strings:
            converted[name] = _decoded(inputs[name], name, self._name)
        return converted


def _decoded(array: np.ndarray, name: str, model: str) -> np.ndarray:
    flat = array.reshape(-1)
    try:
        items = [item.decode() if isinstance(item, bytes) else item for item in flat]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"model '{model}': input '{name}' holds BYTES that are not UTF-8, which ONNX "
            "Runtime's string tensors cannot carry"
        ) from None
    return np.fromiter(items, dtype=object, count=len(items)).reshape(array.shape)


ARENA_SHRINKAGE_KEY = "memory.enable_memory_arena_shrinkage"


def _run_options() -> Any:
    options = ort.RunOptions()
    # A failed run comes back as an exception, logged by whoever handles it; without
    # this ORT would also print every failure (each out-of-memory batch) to stderr.
    options.log_severity_level = 4
    return options


def _dtype_fits(dtype: np.dtype[Any], datatype: DataType) -> bool:
    if datatype is BYTES:
        return dtype.kind in ("O", "S", "U")
    return bool(dtype == datatype.numpy)
