"""Running a loaded ``torch.export`` program on the CPU, or on one GPU on its own CUDA stream.

On a GPU every tensor fixed apart from the batch axis gets a pinned host buffer and a device
buffer sized for ``max_batch_size`` at load (``onnx_io.IoLayout``, the plan ONNX Runtime's
binding uses too): a batch is copied into the pinned buffer, on to the device and back on
the instance's stream, so instances on one GPU overlap. With CUDA graphs, one graph per
batch size reads those device buffers; a batch is padded up to the next captured size
(``onnx_io.plan_batch``) and larger ones run eagerly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.onnx_io import WARMUP_RUNS, IoLayout, plan_batch
from batchserve.backends.torch_program import ProgramLayout

Tensors = Mapping[str, Any]  # name -> torch.Tensor


class ProgramCall:
    """Calls the program's module with named tensors and names what it returns."""

    def __init__(self, torch: Any, module: Any, layout: ProgramLayout) -> None:
        self.torch, self.module, self.layout = torch, module, layout
        self.outputs = tuple(spec.name for spec in layout.signature.outputs)

    def __call__(self, tensors: Tensors) -> dict[str, Any]:
        args = [tensors[name] for name in self.layout.positional]
        kwargs = {name: tensors[name] for name in self.layout.keywords}
        with self.torch.inference_mode():
            result = self.module(*args, **kwargs)
        if self.layout.outputs_by_key:
            return {name: result[name] for name in self.outputs}
        values = (
            (result,) if len(self.outputs) == 1 and not isinstance(result, tuple | list) else result
        )
        return dict(zip(self.outputs, values, strict=True))


def host_tensor(torch: Any, array: np.ndarray) -> Any:
    """A CPU tensor over the array's memory; a copy only for read-only request views."""
    contiguous = np.ascontiguousarray(array)
    if not contiguous.flags.writeable:  # torch.from_numpy would warn, and may not write
        contiguous = contiguous.copy()
    return torch.from_numpy(contiguous)


def stage(torch: Any, staged: Any, array: np.ndarray) -> None:
    """Copy a batch into its pinned host buffer on this thread alone.

    torch copies a large CPU tensor on its OpenMP pool, whose threads then spin-wait for
    more work (libgomp's default). On an H200 host a served GPU model's server used 5-10 of
    16 cores whatever the load, cores its request handling needed; a copy like this one at
    about 70 batches a second kept 0.78 of 2 cores busy on a CPU, against 0.16 with numpy's
    (``bench/NOTES.md``). A dtype numpy cannot view (bfloat16) is still copied by torch.
    """
    try:
        view = staged.numpy()
    except TypeError:
        staged.copy_(host_tensor(torch, array))
        return
    np.copyto(view, array)


class CpuRunner:
    """The program on the CPU: numpy in, numpy out, no copies beyond torch's own."""

    graph_sizes: tuple[int, ...] = ()

    def __init__(self, call: ProgramCall) -> None:
        self._call = call

    def run(self, inputs: Arrays, names: Sequence[str]) -> dict[str, np.ndarray]:
        torch = self._call.torch
        outputs = self._call({name: host_tensor(torch, a) for name, a in inputs.items()})
        return {name: outputs[name].contiguous().numpy() for name in names}

    def memory_bytes(self) -> int | None:
        return None  # the probe measures the process (RSS and malloc)

    def release_cached(self) -> None:
        """Nothing kept: torch's CPU allocator returns large blocks to the system."""

    def close(self) -> None:
        self._call.module = None


class CudaRunner:
    """The program on one GPU, computing on its own stream; ``close`` frees what it holds.

    Args:
        call: the program, already moved to the device.
        io: which tensors get fixed pinned and device buffers (empty without a batch axis).
        index: the CUDA device.
        graph_sizes: batch sizes to capture CUDA graphs for (needs ``io.complete``).
        base_bytes: what torch had allocated on the device before the instance's weights
            (``start_meter``), so ``memory_bytes`` counts this instance's share.
        busy_wait: wait for a batch spinning in ``cudaStreamSynchronize`` (the config's
            ``optimization.cuda.busy_wait_events``); by default the thread blocks on an
            event instead, as ``devices.cuda.Stream`` does and for the same reason.
    """

    def __init__(
        self,
        call: ProgramCall,
        io: IoLayout,
        index: int,
        graph_sizes: Sequence[int] = (),
        base_bytes: int = 0,
        busy_wait: bool = False,
    ) -> None:
        torch = call.torch
        self._call, self._io, self.index, self._base = call, io, index, base_bytes
        self.stream = torch.cuda.Stream(device=index)
        self._done = None if busy_wait else torch.cuda.Event(blocking=True)
        self._pinned: dict[str, Any] = {}
        self._device: dict[str, Any] = {}
        self._graphs: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._pool: Any = None
        with self._on_stream():  # outputs need no device buffer: the program allocates them
            for fixed in io.tensors():
                shape = fixed.shape(io.capacity)
                dtype = getattr(torch, fixed.datatype.numpy.name)
                self._pinned[fixed.name] = torch.zeros(shape, dtype=dtype, pin_memory=True)
                if fixed.name in io.inputs:
                    self._device[fixed.name] = torch.zeros(shape, dtype=dtype, device=index)
        self.stream.synchronize()
        if graph_sizes and io.complete:
            self._capture(sorted(graph_sizes, reverse=True))

    @property
    def graph_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def run(self, inputs: Arrays, names: Sequence[str]) -> dict[str, np.ndarray]:
        plan = plan_batch(self._io, inputs, self.graph_sizes)
        with self._on_stream():
            if plan.graph is not None:
                self._put_fixed(inputs, plan.rows)
                graph, static = self._graphs[plan.graph]
                graph.replay()
                outputs = {name: static[name][: plan.rows] for name in names}
            else:
                outputs = self._call(self._device_inputs(inputs, plan.rows, plan.fixed))
            fetched = self._fetch({name: outputs[name] for name in names}, plan.rows)
        self._wait()
        # Pinned buffers are reused by the next batch: what lies in them is handed out copied.
        return {
            name: t.numpy().copy() if reused else t.numpy() for name, (t, reused) in fetched.items()
        }

    def _wait(self) -> None:
        """Return once the batch queued on the stream is done."""
        if self._done is None:
            self.stream.synchronize()
            return
        self._done.record(self.stream)
        self._done.synchronize()

    def release_cached(self) -> None:
        """Give the caching allocator's free blocks back to the device (after a run on
        memory lent beyond the reservation)."""
        torch = self._call.torch
        with torch.cuda.device(self.index):
            torch.cuda.empty_cache()

    def memory_bytes(self) -> int:
        """What torch allocated on the device since this instance began loading, at its
        peak: weights, buffers, graph pools and the largest batch's activations (the caching
        allocator keeps those blocks for the instance). Loads run one at a time, so other
        instances' traffic can only add to this figure."""
        torch = self._call.torch
        return max(0, int(torch.cuda.max_memory_allocated(self.index)) - self._base)

    def close(self) -> None:
        torch = self._call.torch
        self.stream.synchronize()
        self._graphs.clear()
        self._pinned.clear()
        self._device.clear()
        self._call.module = self._pool = None
        with torch.cuda.device(self.index):
            torch.cuda.empty_cache()  # give the freed blocks back, so NVML sees them go

    @contextmanager
    def _on_stream(self) -> Iterator[None]:
        torch = self._call.torch
        with torch.cuda.device(self.index), torch.cuda.stream(self.stream):
            yield

    def _put_fixed(self, inputs: Arrays, rows: int) -> None:
        torch = self._call.torch
        for name, array in inputs.items():
            staged = self._pinned[name][:rows]
            stage(torch, staged, array)
            self._device[name][:rows].copy_(staged, non_blocking=True)

    def _device_inputs(self, inputs: Arrays, rows: int, fixed: bool) -> dict[str, Any]:
        torch = self._call.torch
        staged = {n: a for n, a in inputs.items() if fixed and n in self._io.inputs}
        self._put_fixed(staged, rows)
        tensors = {name: self._device[name][:rows] for name in staged}
        for name, array in inputs.items():
            if name not in tensors:
                tensors[name] = host_tensor(torch, array).to(self.index)
        return tensors

    def _fetch(self, outputs: Mapping[str, Any], rows: int) -> dict[str, tuple[Any, bool]]:
        """Queue each output's copy to the host: into its pinned buffer where it fits."""
        fetched: dict[str, tuple[Any, bool]] = {}
        for name, value in outputs.items():
            pinned = self._pinned.get(name)
            if pinned is not None and fits_buffer(tuple(value.shape), tuple(pinned.shape), rows):
                pinned[:rows].copy_(value, non_blocking=True)
                fetched[name] = (pinned[:rows], True)
            else:
                fetched[name] = (value.to("cpu"), False)
        return fetched

    def _capture(self, sizes: Sequence[int]) -> None:
        """One graph per size, largest first so the smaller ones reuse its pool's memory.

        Graphs run one at a time on this stream and every output is copied out right after
        a replay, so sharing the pool between them is safe.
        """
        torch = self._call.torch
        self._pool = torch.cuda.graph_pool_handle()
        with self._on_stream():
            for size in sizes:
                static = {name: self._device[name][:size] for name in self._io.inputs}
                for _ in range(WARMUP_RUNS):
                    self._call(static)
                self.stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(
                    graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"
                ):
                    outputs = self._call(static)
                self._graphs[size] = (graph, outputs)
        self.stream.synchronize()


def fits_buffer(shape: tuple[int, ...], buffer: tuple[int, ...], rows: int) -> bool:
    """Whether an output of ``shape`` goes through a fixed buffer of shape ``buffer``: its
    ``rows`` rows and the buffer's other dimensions, in no more rows than the buffer has (a
    batch over ``max_batch_size`` runs without the fixed buffers)."""
    return rows <= buffer[0] and shape == (rows, *buffer[1:])


def start_meter(torch: Any, index: int) -> int:
    """Bytes torch holds on the device now, with its peak reset: call before loading weights.

    CUDA is initialised first: in a process that has not touched the GPU yet, the caching
    allocator has no devices, and resetting its peak raises "Invalid device argument".
    """
    torch.cuda.init()
    allocated = int(torch.cuda.memory_allocated(index))
    torch.cuda.reset_peak_memory_stats(index)
    return allocated
