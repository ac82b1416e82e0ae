"""ONNX Runtime I/O binding with buffers sized once and reused by every batch.

On a GPU, each tensor whose axes are fixed apart from the batch axis gets a device buffer and
a pinned host buffer sized for ``max_batch_size`` at load: a batch's inputs are copied into
the pinned buffer and on to the device once, outputs are computed straight into device
memory and copied back once, all on the instance's own CUDA stream. Because those device
addresses never change, ONNX Runtime can capture a CUDA graph per preferred batch size
(``gpu_graph_id``) and batches are padded up to the next captured size.

``HostMemory`` runs the same binding logic on plain numpy buffers, so the CPU ``io_binding``
path is this code too, and every step but the CUDA copies is tested without a GPU. Tensors
with another free axis (a sequence length) or string tensors are bound per batch instead:
inputs from host memory, outputs to memory ONNX Runtime allocates. BF16 tensors are bound by
ONNX's type (``onnx_bf16``); one ORT allocates is kept in host memory, where it can be read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import padded_batch
from batchserve.backends.onnx_bf16 import bf16_array, bf16_names, bf16_value, element_type
from batchserve.backends.onnx_stop import RunStopper
from batchserve.core.datatypes import BYTES, DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.devices import cuda

GRAPH_ID_KEY = "gpu_graph_id"  # ONNX Runtime's run option naming the CUDA graph of a run
SKIP_GRAPH = "-1"  # that option's value for "run without capturing or replaying a graph"
# ORT captures a graph on the run after its first regular run for that graph id; one more
# run replays it, so a capture that failed silently would show up at load, not in traffic.
WARMUP_RUNS = 3


@dataclass(frozen=True, slots=True)
class FixedRows:
    """A tensor whose every axis but the leading batch axis is fixed."""

    name: str
    datatype: DataType
    row_shape: tuple[int, ...]

    def shape(self, rows: int) -> tuple[int, ...]:
        return (rows, *self.row_shape)

    def nbytes(self, rows: int) -> int:
        return rows * math.prod(self.row_shape) * self.datatype.itemsize


def fixed_rows(spec: TensorSpec) -> FixedRows | None:
    """The tensor's row layout, or None when a buffer cannot be sized for it once."""
    shape = spec.shape
    if spec.datatype is BYTES or not shape or shape[0] != DYNAMIC or DYNAMIC in shape[1:]:
        return None
    return FixedRows(spec.name, spec.datatype, shape[1:])


@dataclass(frozen=True, slots=True)
class IoLayout:
    """Which tensors get buffers sized once, for how many rows.

    Args:
        capacity: rows every buffer holds (the model's ``max_batch_size``).
        inputs: the fixed-row inputs, by name.
        outputs: the fixed-row outputs, by name.
        complete: every input and output is fixed-row (CUDA graphs need that).
        bf16: the BF16 tensors, fixed-row or not, by name.
    """

    capacity: int
    inputs: Mapping[str, FixedRows]
    outputs: Mapping[str, FixedRows]
    complete: bool
    bf16: frozenset[str] = frozenset()

    @classmethod
    def plan(cls, signature: ModelSignature, capacity: int) -> IoLayout:
        bf16 = bf16_names(signature)
        if capacity < 1:  # no batch axis: nothing to size for a batch
            return cls(0, {}, {}, False, bf16)
        inputs = {s.name: f for s in signature.inputs if (f := fixed_rows(s)) is not None}
        outputs = {s.name: f for s in signature.outputs if (f := fixed_rows(s)) is not None}
        complete = len(inputs) == len(signature.inputs) and len(outputs) == len(signature.outputs)
        return cls(capacity, inputs, outputs, complete and bool(inputs), bf16)

    def tensors(self) -> list[FixedRows]:
        return [*self.inputs.values(), *self.outputs.values()]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How one batch is bound: its rows, the rows bound (padded for a graph), and the graph.

    Args:
        rows: rows in the batch.
        bound_rows: rows the fixed buffers are bound with (``rows`` padded up to a graph size).
        graph: the CUDA graph's batch size, or None to run without one.
        fixed: bind the fixed-row tensors to their buffers (False: the batch does not fit).
    """

    rows: int
    bound_rows: int
    graph: int | None
    fixed: bool


def plan_batch(layout: IoLayout, inputs: Arrays, graph_sizes: Sequence[int]) -> BatchPlan:
    """Decide how a batch is bound; pure, so padding and graph choice are tested on a CPU."""
    first = next(iter(inputs.values()), None)
    rows = int(first.shape[0]) if first is not None and first.ndim else 0
    fits = 0 < rows <= layout.capacity
    if not fits:
        return BatchPlan(rows, rows, None, False)
    graph = padded_batch(rows, graph_sizes) if layout.complete and graph_sizes else None
    if graph is not None and not _all_fixed_rows(layout, inputs, rows):
        graph = None
    return BatchPlan(rows, graph or rows, graph, True)


def _all_fixed_rows(layout: IoLayout, inputs: Arrays, rows: int) -> bool:
    if set(inputs) != set(layout.inputs):
        return False
    return all(inputs[n].shape == f.shape(rows) for n, f in layout.inputs.items())


class Memory(Protocol):
    """Where the fixed buffers live: numpy memory, or a GPU with pinned host staging."""

    device_type: str  # ONNX Runtime's device name for binding: "cpu" or "cuda"
    device_id: int

    def allocate(self, name: str, nbytes: int) -> None: ...
    def pointer(self, name: str) -> int: ...
    def put(self, name: str, array: np.ndarray) -> None: ...
    def fetch(self, name: str, nbytes: int) -> None: ...
    def wait(self) -> None: ...
    def view(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray: ...
    def activate(self) -> None: ...
    def close(self) -> None: ...


class HostMemory:
    """Buffers in host memory: the CPU path, and a GPU path without cuda-python (ORT copies)."""

    device_type = "cpu"
    device_id = 0

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def allocate(self, name: str, nbytes: int) -> None:
        self._buffers[name] = np.zeros(max(nbytes, 1), np.uint8)

    def pointer(self, name: str) -> int:
        return int(self._buffers[name].ctypes.data)

    def put(self, name: str, array: np.ndarray) -> None:
        self._buffers[name][: array.nbytes] = array.reshape(-1).view(np.uint8)

    def fetch(self, name: str, nbytes: int) -> None:
        """Nothing to copy: the output was written straight into the buffer."""

    def wait(self) -> None:
        """Nothing queued."""

    def view(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape) * dtype.itemsize
        return self._buffers[name][:count].view(dtype).reshape(shape)

    def activate(self) -> None:
        """No per-thread state."""

    def close(self) -> None:
        self._buffers.clear()


class CudaMemory:
    """A device buffer and a pinned host buffer per tensor, and the instance's own stream.

    The stream is created before the session so ONNX Runtime can compute on it
    (``user_compute_stream``): the copies queued here and the model's kernels are then
    ordered on one stream that belongs to this instance alone.
    """

    device_type = "cuda"

    def __init__(self, device_index: int, busy_wait: bool = False) -> None:
        cuda.set_device(device_index)
        self.device_id = device_index
        self.stream = cuda.Stream(busy_wait)
        self._device: dict[str, cuda.DeviceBuffer] = {}
        self._pinned: dict[str, cuda.PinnedBuffer] = {}

    def allocate(self, name: str, nbytes: int) -> None:
        self._device[name] = cuda.DeviceBuffer(nbytes)
        self._pinned[name] = cuda.PinnedBuffer(nbytes)
        # Rows past a batch (padding up to a graph's size) hold zeros or an earlier batch's
        # rows, never uninitialised memory.
        cuda.memset_async(self._device[name], 0, self.stream)

    def pointer(self, name: str) -> int:
        return self._device[name].pointer

    def put(self, name: str, array: np.ndarray) -> None:
        staged = self._pinned[name].view(array.dtype, array.shape)
        np.copyto(staged, array)
        cuda.copy_to_device_async(self._device[name], staged, self.stream)

    def fetch(self, name: str, nbytes: int) -> None:
        cuda.copy_to_host_async(self._pinned[name], self._device[name], nbytes, self.stream)

    def wait(self) -> None:
        self.stream.synchronize()

    def view(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        return self._pinned[name].view(dtype, shape)

    def activate(self) -> None:
        cuda.set_device(self.device_id)  # CUDA's current device is per thread

    def close(self) -> None:
        for pinned in self._pinned.values():
            pinned.close()
        for buffer in self._device.values():
            buffer.close()
        self._pinned.clear()
        self._device.clear()
        self.stream.close()


class BoundRunner:
    """Runs batches of one session through I/O binding over buffers allocated once.

    Args:
        session: the ``InferenceSession``.
        layout: which tensors get fixed buffers.
        memory: where those buffers live.
        make_options: a fresh ``RunOptions`` as the backend configures them.
        graph_sizes: batch sizes ONNX Runtime captures CUDA graphs for (graph id = position
            + 1: 0 is ORT's default id, -1 means no graph); empty without graphs.
        where: names the model in error messages.
    """

    def __init__(
        self,
        session: Any,
        layout: IoLayout,
        memory: Memory,
        make_options: Callable[[], Any],
        graph_sizes: Sequence[int] = (),
        where: str = "model",
    ) -> None:
        self._session, self._layout, self._memory = session, layout, memory
        self._where = where
        self.graph_sizes = tuple(sorted(graph_sizes))
        memory.activate()
        for tensor in layout.tensors():
            memory.allocate(tensor.name, tensor.nbytes(layout.capacity))
        self._plain = make_options()
        if self.graph_sizes:
            self._plain.add_run_config_entry(GRAPH_ID_KEY, SKIP_GRAPH)
        self._bindings: dict[int, Any] = {}  # bound rows -> a binding of every fixed buffer
        self._graphs: dict[int, Any] = {}
        for position, size in enumerate(self.graph_sizes, start=1):
            options = make_options()
            options.add_run_config_entry(GRAPH_ID_KEY, str(position))
            self._graphs[size] = options

    def capture_graphs(self) -> None:
        """Run each graph's batch size at load, so ORT captures it before traffic arrives."""
        outputs = list(self._layout.outputs)
        for size in self.graph_sizes:
            zeros = {
                n: np.zeros(f.shape(size), f.datatype.numpy) for n, f in self._layout.inputs.items()
            }
            for _ in range(WARMUP_RUNS):
                self.run(zeros, outputs)

    def run(
        self,
        inputs: Arrays,
        names: Sequence[str],
        options: Any = None,
        stopper: RunStopper | None = None,
    ) -> list[np.ndarray]:
        """The outputs ``names`` for one batch, as host arrays the caller owns; ``options``
        replace the run options for this batch (it then runs without a CUDA graph);
        ``stopper`` may end the run from another thread."""
        memory, layout = self._memory, self._layout
        memory.activate()
        batch = plan_batch(layout, inputs, self.graph_sizes)
        held: list[np.ndarray] = []
        allocated: dict[str, int] = {}
        if self._reusable(batch, inputs, names):
            for name, array in inputs.items():
                memory.put(name, np.ascontiguousarray(array))
            binding = self._bindings.get(batch.bound_rows)
            if binding is None:
                binding = self._bindings[batch.bound_rows] = self._fixed_binding(batch)
        else:
            binding = self._session.io_binding()
            held = self._bind_inputs(binding, inputs, batch)
            allocated = self._bind_outputs(binding, names, batch)
        memory.wait()  # inputs are on the device before ORT starts, whichever stream it uses
        if options is None:
            options = self._plain if batch.graph is None else self._graphs[batch.graph]
        with stopper.running(options) if stopper is not None else nullcontext():
            self._session.run_with_iobinding(binding, options)
        del held
        fixed = [n for n in names if n not in allocated]
        for name in fixed:
            memory.fetch(name, layout.outputs[name].nbytes(batch.rows))
        memory.wait()
        results = {n: self._copy_out(n, batch.rows) for n in fixed}
        if allocated:
            values = binding.get_outputs()
            bf16 = layout.bf16
            results |= {
                n: bf16_array(values[i]) if n in bf16 else values[i].numpy()
                for n, i in allocated.items()
            }
        return [results[n] for n in names]

    def _reusable(self, batch: BatchPlan, inputs: Arrays, names: Sequence[str]) -> bool:
        """Every tensor is in its buffer: the binding for this many rows can be reused."""
        layout = self._layout
        return (
            batch.fixed
            and layout.complete
            and _all_fixed_rows(layout, inputs, batch.rows)
            and all(name in layout.outputs for name in names)
        )

    def _fixed_binding(self, batch: BatchPlan) -> Any:
        """A binding of every tensor to its buffer at ``batch.bound_rows`` rows, kept for reuse:
        the addresses never change, so neither does the binding."""
        binding = self._session.io_binding()
        memory = self._memory
        for name, tensor in self._layout.inputs.items():
            binding.bind_input(
                name,
                memory.device_type,
                memory.device_id,
                element_type(tensor.datatype),
                tensor.shape(batch.bound_rows),
                memory.pointer(name),
            )
        self._bind_outputs(binding, (), batch)
        return binding

    def _bind_inputs(self, binding: Any, inputs: Arrays, batch: BatchPlan) -> list[np.ndarray]:
        held: list[np.ndarray] = []
        memory = self._memory
        for name, array in inputs.items():
            tensor = self._layout.inputs.get(name)
            if tensor is not None and array.shape[1:] != tensor.row_shape:
                raise InvalidArgument(
                    f"{self._where}: input '{name}' has shape {list(array.shape)}, but the model "
                    f"takes {[-1, *tensor.row_shape]}"
                )
            contiguous = np.ascontiguousarray(array)
            if batch.fixed and tensor is not None and array.shape == tensor.shape(batch.rows):
                memory.put(name, contiguous)
                shape = tensor.shape(batch.bound_rows)
                binding.bind_input(
                    name,
                    memory.device_type,
                    memory.device_id,
                    element_type(tensor.datatype),
                    shape,
                    memory.pointer(name),
                )
            else:  # ORT copies it to the device for this run
                held.append(contiguous)
                if name in self._layout.bf16:
                    binding.bind_ortvalue_input(name, bf16_value(contiguous))
                else:
                    binding.bind_cpu_input(name, contiguous)
        return held

    def _bind_outputs(self, binding: Any, names: Sequence[str], batch: BatchPlan) -> dict[str, int]:
        """Bind every fixed output (a graph writes them all) and the requested others."""
        memory = self._memory
        order: list[str] = []
        if batch.fixed:
            for name, tensor in self._layout.outputs.items():
                binding.bind_output(
                    name,
                    memory.device_type,
                    memory.device_id,
                    element_type(tensor.datatype),
                    list(tensor.shape(batch.bound_rows)),
                    memory.pointer(name),
                )
                order.append(name)
        allocated: dict[str, int] = {}
        for name in names:
            if name in order:
                continue
            if name in self._layout.bf16:  # read back from host memory (``bf16_array``)
                binding.bind_output(name, "cpu", 0)
            else:
                binding.bind_output(name, memory.device_type, memory.device_id)
            allocated[name] = len(order)
            order.append(name)
        return allocated

    def _copy_out(self, name: str, rows: int) -> np.ndarray:
        tensor = self._layout.outputs[name]
        # A copy: the buffer is overwritten by the next batch.
        return self._memory.view(name, tensor.datatype.numpy, tensor.shape(rows)).copy()

    def close(self) -> None:
        """Drop the session; the memory belongs to the backend, which outlives both."""
        self._bindings.clear()
        self._session = None
