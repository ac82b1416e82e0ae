"""CUDA devices simulated in host memory, in place of a few functions of cuda-bindings.

The stub driver answers "no device", and CUDA's runtime cannot be made to see one (it needs
the driver's private tables). Where a test needs CUDA to see GPUs, ``HostCuda.install``
replaces the runtime functions it simulates in the installed ``cuda.bindings.runtime`` module,
the one the project calls: each replacement takes its arguments as the real function's
signature does and answers as cuda-bindings does, ``(cudaError_t.cudaSuccess, value)``, with
real cuda-bindings types where the project reads fields (``cudaDeviceProp``). Device memory is
host memory; a stream keeps the work queued on it (copies, kernels, graph launches) until a
wait on the stream or on an event recorded there runs it, so a result read without such a
wait is stale, as on a GPU; and a CUDA graph records the work queued while it captures and
replays it. Every other function stays the real one over the stub driver, so a
call this does not simulate fails as on a machine without a GPU, naming itself.
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

Work = Callable[[], None]


@dataclass(frozen=True, slots=True)
class SimulatedGpu:
    """What one simulated device reports."""

    uuid: bytes  # 16 bytes, as cudaDeviceProp.uuid holds them
    name: str = "Stub GPU"
    total_bytes: int = 16 << 30
    pci_bus: int = 0


def uuid_text(uuid: bytes) -> str:
    """NVML's spelling of a CUDA UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    hexed = uuid.hex()
    parts = (hexed[:8], hexed[8:12], hexed[12:16], hexed[16:20], hexed[20:])
    return "GPU-" + "-".join(parts)


@dataclass
class HostCuda:
    """A CUDA runtime with ``gpus``, in host memory; ``leaks`` says what was never freed."""

    cudart: Any
    gpus: list[SimulatedGpu] = field(default_factory=list)
    device: dict[int, bytearray] = field(default_factory=dict)
    pinned: dict[int, Any] = field(default_factory=dict)
    streams: set[int] = field(default_factory=set)
    queued: dict[int, list[Work]] = field(default_factory=dict)
    """Work on each stream, not yet run."""
    events: dict[int, int] = field(default_factory=dict)
    """Each event's creation flags."""
    recorded: dict[int, int] = field(default_factory=dict)
    """The stream each event was last recorded on."""
    graphs: dict[int, list[Work]] = field(default_factory=dict)
    executables: dict[int, list[Work]] = field(default_factory=dict)
    capture: list[Work] | None = None
    calls: list[str] = field(default_factory=list)
    current: int = 0
    _handles: Any = field(default_factory=lambda: itertools.count(0x7000_0000_0000, 0x1000_0000))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> HostCuda:
        """Put the simulated functions in place of cuda-bindings' own, for one test."""
        for name in dir(self):
            if name.startswith("_cuda"):
                function = name.removeprefix("_")
                monkeypatch.setattr(self.cudart, function, self._entry(function))
        return self

    def _entry(self, function: str) -> Callable[..., tuple[Any, ...]]:
        signature = inspect.signature(getattr(self.cudart, function))
        handler = getattr(self, f"_{function}")
        success = self.cudart.cudaError_t.cudaSuccess

        def entry(*args: Any) -> tuple[Any, ...]:
            signature.bind(*args)  # TypeError: not how cuda-bindings takes it
            self.calls.append(function)
            value = handler(*args)
            return (success,) if value is None else (success, value)

        return entry

    def enqueue(self, work: Work, stream: int) -> None:
        """Work queued on ``stream``: recorded while capturing, else run at the next wait."""
        assert stream in self.streams, f"work queued on unknown stream {stream}"
        if self.capture is not None:
            self.capture.append(work)
        else:
            self.queued.setdefault(stream, []).append(work)

    def _drain(self, stream: int) -> None:
        for work in self.queued.pop(stream, []):
            work()

    def leaks(self) -> dict[str, int]:
        alive = {
            "device buffers": len(self.device),
            "pinned buffers": len(self.pinned),
            "streams": len(self.streams),
            "events": len(self.events),
            "graphs": len(self.graphs),
            "graph executables": len(self.executables),
        }
        return {kind: count for kind, count in alive.items() if count}

    def read(self, pointer: int, nbytes: int) -> bytes:
        """Device memory at ``pointer`` (a buffer's start), for a simulated kernel."""
        return bytes(self.device[pointer][:nbytes])

    def write(self, pointer: int, data: bytes) -> None:
        self.device[pointer][: len(data)] = data

    def _new_handle(self) -> int:
        return int(next(self._handles))

    def _cudaGetDeviceCount(self) -> int:  # noqa: N802 - named after the CUDA call
        return len(self.gpus)

    def _cudaSetDevice(self, index: int) -> None:  # noqa: N802
        assert 0 <= index < len(self.gpus), f"cudaSetDevice({index}) with {len(self.gpus)} GPUs"
        self.current = index

    def _cudaGetDeviceProperties(self, index: int) -> Any:  # noqa: N802
        assert 0 <= index < len(self.gpus), f"cudaGetDeviceProperties({index})"
        gpu = self.gpus[index]
        properties = self.cudart.cudaDeviceProp()
        ctypes.memmove(properties.uuid.getPtr(), gpu.uuid, 16)  # cuda-bindings: read-only
        properties.name = gpu.name.encode().ljust(256, b"\0")
        properties.totalGlobalMem = gpu.total_bytes
        properties.pciBusID = gpu.pci_bus
        return properties

    def _cudaStreamCreateWithFlags(self, flags: int) -> int:  # noqa: N802
        handle = self._new_handle()
        self.streams.add(handle)
        return handle

    def _cudaStreamSynchronize(self, stream: int) -> None:  # noqa: N802
        assert stream in self.streams, f"cudaStreamSynchronize on unknown stream {stream}"
        self._drain(stream)

    def _cudaStreamDestroy(self, stream: int) -> None:  # noqa: N802
        self._drain(stream)  # as CUDA does: destroying a stream lets its work finish
        self.streams.remove(stream)

    def _cudaEventCreateWithFlags(self, flags: int) -> int:  # noqa: N802
        handle = self._new_handle()
        self.events[handle] = int(flags)
        return handle

    def _cudaEventRecord(self, event: int, stream: int) -> None:  # noqa: N802
        assert event in self.events, f"cudaEventRecord of unknown event {event}"
        assert stream in self.streams, f"cudaEventRecord on unknown stream {stream}"
        assert self.capture is None, "an event recorded while capturing joins the graph"
        self.recorded[event] = stream

    def _cudaEventSynchronize(self, event: int) -> None:  # noqa: N802
        assert event in self.recorded, f"cudaEventSynchronize on event {event} never recorded"
        self._drain(self.recorded[event])

    def _cudaEventDestroy(self, event: int) -> None:  # noqa: N802
        del self.events[event]
        self.recorded.pop(event, None)

    def _cudaMalloc(self, size: int) -> int:  # noqa: N802
        pointer = self._new_handle()
        self.device[pointer] = bytearray(size)
        return pointer

    def _cudaFree(self, pointer: int) -> None:  # noqa: N802
        del self.device[pointer]

    def _cudaMallocHost(self, size: int) -> int:  # noqa: N802
        buffer = ctypes.create_string_buffer(size)
        self.pinned[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def _cudaFreeHost(self, pointer: int) -> None:  # noqa: N802
        del self.pinned[pointer]

    def _cudaMemcpyAsync(  # noqa: N802
        self, target: int, source: int, nbytes: int, kind: Any, stream: int
    ) -> None:
        work: Work
        if kind == self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice:
            work = partial(self._to_device, target, source, nbytes)
        elif kind == self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost:
            work = partial(self._to_host, target, source, nbytes)
        else:
            raise AssertionError(f"HostCuda does not simulate copies of kind {kind!r}")
        self.enqueue(work, stream)

    def _to_device(self, target: int, source: int, nbytes: int) -> None:
        self.write(target, ctypes.string_at(source, nbytes))  # read when it runs, as a GPU

    def _to_host(self, target: int, source: int, nbytes: int) -> None:
        ctypes.memmove(target, self.read(source, nbytes), nbytes)

    def _cudaMemsetAsync(  # noqa: N802
        self, target: int, value: int, nbytes: int, stream: int
    ) -> None:
        self.enqueue(partial(self.write, target, bytes([value]) * nbytes), stream)

    def _cudaStreamBeginCapture(self, stream: int, mode: Any) -> None:  # noqa: N802
        assert self.capture is None, "a capture is already under way"
        self.capture = []

    def _cudaStreamEndCapture(self, stream: int) -> int:  # noqa: N802
        assert self.capture is not None, "cudaStreamEndCapture without a capture"
        handle = self._new_handle()
        self.graphs[handle], self.capture = self.capture, None
        return handle

    def _cudaGraphInstantiate(self, graph: int, flags: int) -> int:  # noqa: N802
        handle = self._new_handle()
        self.executables[handle] = list(self.graphs[graph])
        return handle

    def _cudaGraphDestroy(self, graph: int) -> None:  # noqa: N802
        del self.graphs[graph]

    def _cudaGraphLaunch(self, executable: int, stream: int) -> None:  # noqa: N802
        for work in self.executables[executable]:
            self.enqueue(work, stream)

    def _cudaGraphExecDestroy(self, executable: int) -> None:  # noqa: N802
        del self.executables[executable]
