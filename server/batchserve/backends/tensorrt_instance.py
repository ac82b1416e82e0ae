"""What one TensorRT instance owns on the GPU, and how it runs a batch there.

Buffers are sized once at load for the largest shapes of every optimisation profile the
instance may use, so a batch never allocates: inputs go through pinned host buffers to the
device on the instance's own stream, outputs come back the same way, and every buffer is
reused by the next batch. Each batch runs on the profile tuned nearest its size; with CUDA
graphs, a batch is padded up to the next captured size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import padded_batch
from batchserve.backends.tensorrt_engine import (
    io_names,
    output_tensor,
    profile_input,
    require_linear,
    scratch_bytes,
)
from batchserve.backends.tensorrt_profiles import EngineTensor, Profile, pick_profile, union_tensor
from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.devices import cuda


@dataclass(frozen=True, slots=True)
class _CapturedGraph:
    """A CUDA graph for one padded batch size, its own context, and the output shapes."""

    graph: cuda.Graph
    context: Any  # never reshaped after capture: the graph replays what it held then
    outputs: dict[str, tuple[int, ...]]


class EngineInstance:
    """What one loaded instance owns on the GPU; ``close`` frees it all and may run twice.

    One execution context per optimisation profile (and one per CUDA graph), so a batch
    never switches a context's profile. They share one scratch buffer: the instance runs
    one batch at a time on its one stream, so no two of them use it at once.
    """

    def __init__(self, runtime: Any, engine: Any, busy_wait: bool = False) -> None:
        self.runtime, self.engine = runtime, engine
        self.stream = cuda.Stream(busy_wait)
        self.scratch: cuda.DeviceBuffer | None = None
        self.profiles: list[Profile] = []
        self.contexts: dict[int, Any] = {}
        self.tensors: dict[str, EngineTensor] = {}
        self.device_buffers: dict[str, cuda.DeviceBuffer] = {}
        self.host_buffers: dict[str, cuda.PinnedBuffer] = {}
        self.graphs: dict[int, _CapturedGraph] = {}

    def open(self, trt: Any, profiles: Sequence[int], path: Path) -> None:
        self.scratch = cuda.DeviceBuffer(scratch_bytes(self.engine))
        input_names, output_names = io_names(trt, self.engine)
        require_linear(trt, self.engine, [*input_names, *output_names], path)
        outputs: dict[str, list[EngineTensor]] = {name: [] for name in output_names}
        for index in profiles:
            profile = self._describe(index, input_names, path)
            context = self._context(trt, index, path)
            for tensor in profile.inputs.values():
                if not context.set_input_shape(tensor.name, tensor.max_shape):
                    raise ModelConfigError(f"{path}: TensorRT rejects profile {index}'s maximum")
            for name in output_names:
                outputs[name].append(output_tensor(self.engine, context, name, path))
            self.profiles.append(profile)
            self.contexts[index] = context
        for name in input_names:
            self.tensors[name] = union_tensor([p.inputs[name] for p in self.profiles])
        for name, per_profile in outputs.items():
            self.tensors[name] = union_tensor(per_profile)
        for tensor in self.tensors.values():
            self.device_buffers[tensor.name] = cuda.DeviceBuffer(tensor.max_bytes)
            self.host_buffers[tensor.name] = cuda.PinnedBuffer(tensor.max_bytes)
            # Rows past a padded batch hold zeros or earlier rows, never uninitialised memory.
            cuda.memset_async(self.device_buffers[tensor.name], 0, self.stream)
        for context in self.contexts.values():
            self._bind(context, path)
        self.stream.synchronize()

    def _describe(self, index: int, input_names: Sequence[str], path: Path) -> Profile:
        described = [profile_input(self.engine, n, index, path) for n in input_names]
        opt = max((batch for _, batch in described), default=1)
        return Profile(index, {t.name: t for t, _ in described}, opt)

    def _context(self, trt: Any, profile: int, path: Path) -> Any:
        """A context on ``profile`` without memory of its own (it uses the shared scratch)."""
        assert self.scratch is not None
        strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
        context = self.engine.create_execution_context(strategy)
        if context is None:
            raise OutOfMemory(f"{path}: TensorRT could not create an execution context")
        if hasattr(context, "set_device_memory"):  # TensorRT >= 10.1
            context.set_device_memory(self.scratch.pointer, self.scratch.nbytes)
        else:
            context.device_memory = self.scratch.pointer
        if not context.set_optimization_profile_async(profile, self.stream.handle):
            raise ModelConfigError(f"{path}: cannot select optimisation profile {profile}")
        return context

    def _bind(self, context: Any, where: Path | str) -> None:
        for name, buffer in self.device_buffers.items():
            if not context.set_tensor_address(name, buffer.pointer):
                raise BackendError(f"{where}: TensorRT refused the buffer of '{name}'")

    def capture_graphs(self, trt: Any, sizes: Sequence[int], path: Path) -> list[str]:
        """Capture a CUDA graph per batch size; returns why sizes were left out."""
        inputs = [t for t in self.tensors.values() if t.is_input]
        if sizes and not all(_batch_only(t) for t in inputs):
            return [f"{path}: CUDA graphs need every input fixed apart from the batch axis"]
        skipped: list[str] = []
        for size in sizes:
            zeros = {t.name: np.zeros((size, *t.max_shape[1:]), t.datatype.numpy) for t in inputs}
            profile = pick_profile(self.profiles, zeros)
            if profile is None:
                skipped.append(f"{path}: no optimisation profile takes batch {size}; no graph")
                continue
            try:  # whether an engine can be captured depends on its layers: degrade, not fail
                captured = self._capture(trt, profile, zeros, path)
            except BatchserveError as exc:
                skipped.append(f"{path}: no CUDA graph for batch {size}: {exc.message}")
                continue
            if any(shape[:1] != (size,) for shape in captured.outputs.values()):
                captured.graph.close()
                return [*skipped, f"{path}: CUDA graphs need every output's first axis batched"]
            self.graphs[size] = captured
        return skipped

    def _capture(
        self, trt: Any, profile: int, zeros: dict[str, np.ndarray], path: Path
    ) -> _CapturedGraph:
        context = self._context(trt, profile, path)
        self._bind(context, path)
        _set_shapes(context, zeros, path)
        _enqueue(context, self.stream, path)  # the first run after setting shapes does setup
        self.stream.synchronize()
        graph = cuda.Graph(self.stream, partial(_enqueue, context, self.stream, path))
        outputs = [t.name for t in self.tensors.values() if not t.is_input]
        shapes = {name: tuple(context.get_tensor_shape(name)) for name in outputs}
        return _CapturedGraph(graph, context, shapes)

    def run(self, inputs: Arrays, names: Sequence[str], model: str) -> dict[str, np.ndarray]:
        where = f"model '{model}'"
        held = {
            t.name: np.ascontiguousarray(inputs[t.name])
            for t in self.tensors.values()
            if t.is_input
        }
        rows = next((int(a.shape[0]) for a in held.values() if a.ndim), 1)
        graph = self._graph_for(held, rows)
        context = self._context_for(held, where) if graph is None else graph.context
        for name, array in held.items():
            staged = self.host_buffers[name].view(array.dtype, array.shape)
            np.copyto(staged, array)
            cuda.copy_to_device_async(self.device_buffers[name], staged, self.stream)
        if graph is not None:
            graph.graph.launch(self.stream)
            shapes = {n: (rows, *graph.outputs[n][1:]) for n in names}
        else:
            _set_shapes(context, held, where)
            _enqueue(context, self.stream, where)
            shapes = {name: tuple(context.get_tensor_shape(name)) for name in names}
        for name, shape in shapes.items():
            nbytes = math.prod(shape) * self.tensors[name].datatype.itemsize
            cuda.copy_to_host_async(
                self.host_buffers[name], self.device_buffers[name], nbytes, self.stream
            )
        self.stream.synchronize()
        return {
            name: self.host_buffers[name].view(self.tensors[name].datatype.numpy, shape).copy()
            for name, shape in shapes.items()
        }

    def _graph_for(self, inputs: Arrays, rows: int) -> _CapturedGraph | None:
        size = padded_batch(rows, list(self.graphs))
        if size is None:
            return None
        fits = all(
            array.shape == (rows, *self.tensors[name].max_shape[1:])
            for name, array in inputs.items()
        )
        return self.graphs[size] if fits else None

    def _context_for(self, inputs: Arrays, where: str) -> Any:
        profile = pick_profile(self.profiles, inputs)
        if profile is None:
            shapes = {name: list(array.shape) for name, array in inputs.items()}
            raise InvalidArgument(
                f"{where}: no optimisation profile of this instance accepts the shapes {shapes}"
            )
        return self.contexts[profile]

    def memory_bytes(self) -> int:
        scratch = 0 if self.scratch is None else self.scratch.nbytes
        return scratch + sum(b.nbytes for b in self.device_buffers.values())

    def close(self) -> None:
        for captured in self.graphs.values():
            captured.graph.close()
        # Contexts go before the memory they use and before their engine, the engine
        # before its runtime.
        self.graphs.clear()
        self.contexts.clear()
        for pinned in self.host_buffers.values():
            pinned.close()
        for buffer in self.device_buffers.values():
            buffer.close()
        self.host_buffers.clear()
        self.device_buffers.clear()
        if self.scratch is not None:
            self.scratch.close()
        self.stream.close()
        self.engine = self.runtime = None


def _set_shapes(context: Any, inputs: Arrays, where: Path | str) -> None:
    for name, array in inputs.items():
        if not context.set_input_shape(name, array.shape):
            raise InvalidArgument(f"{where}: TensorRT rejects shape {array.shape} of '{name}'")


def _enqueue(context: Any, stream: cuda.Stream, where: Path | str) -> None:
    if not context.execute_async_v3(stream.handle):
        raise BackendError(f"{where}: TensorRT execution failed (see its log)")


def _batch_only(tensor: EngineTensor) -> bool:
    """Only the leading axis varies: a graph per batch size covers every request."""
    return tensor.min_shape[1:] == tensor.max_shape[1:] and len(tensor.min_shape) > 0


def open_instance(
    trt: Any,
    runtime: Any,
    engine: Any,
    profiles: Sequence[int],
    path: Path,
    busy_wait: bool = False,
) -> EngineInstance:
    """An instance with its contexts and buffers for ``profiles``; closed again on failure.
    ``busy_wait``: its thread spins while the GPU works (``cuda.Stream``)."""
    instance = EngineInstance(runtime, engine, busy_wait)
    try:
        instance.open(trt, profiles, path)
    except BaseException:
        instance.close()
        raise
    return instance
