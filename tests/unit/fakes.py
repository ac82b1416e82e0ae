"""A real, in-memory implementation of the Backend protocol for scheduler tests, and a
clock the tests advance by hand.

The backend computes ``y = 2x + 1`` and a per-row sum, records every batch it runs, and
can be held (to let a queue build up), made to run out of memory above a batch size, or
made to fail on a poisoned value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BackendError, OutOfMemory
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

FP32 = BY_WIRE["FP32"]

FAKE_CONFIG = """
name: "fake"
max_batch_size: 8
input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] },
        { name: "total" data_type: TYPE_FP32 dims: [1] }]
dynamic_batching {}
"""


def fake_config(extra: str = "", *, batching: bool = True, **fields: int) -> ModelConfig:
    """The fake model's config; ``extra`` pbtxt is merged in, ``fields`` set on top."""
    config = parse_pbtxt(FAKE_CONFIG)
    text_format.Merge(extra, config)
    for name, value in fields.items():
        setattr(config, name, value)
    if not batching:
        config.ClearField("dynamic_batching")
    return config


class FakeBackend:
    """Deterministic arithmetic with switches for the faults a scheduler must survive."""

    def __init__(
        self,
        *,
        oom_above: int | None = None,
        poison: float | None = None,
        stoppable: bool = False,
        holds_bytes: int = 0,
    ) -> None:
        self.oom_above = oom_above
        self.holds_bytes = holds_bytes
        """Memory a load takes and keeps until unloaded, as a runtime's weights: without it the
        load probe measures nothing but what the rest of the process did meanwhile."""
        self._held: np.ndarray | None = None
        self.poison = poison
        self.stoppable = stoppable
        """Whether ``interrupt`` ends a run (ONNX Runtime's) or is ignored (torch's)."""
        self.interrupts = 0
        self._stop = False
        self.batches: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.unloaded = False
        self._device = CPU

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature(
            (TensorSpec("x", FP32, (DYNAMIC, 4)),),
            (TensorSpec("y", FP32, (DYNAMIC, 4)), TensorSpec("total", FP32, (DYNAMIC, 1))),
        )

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        self._device = device
        if self.holds_bytes:
            self._held = np.ones(self.holds_bytes, np.uint8)  # written: resident, not reserved

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.entered.release()
        self.gate.wait(timeout=10)
        if self._stop:
            self._stop = False
            raise BackendError("Exiting due to terminate flag being set to true.")
        if self.oom_above is not None and len(x) > self.oom_above:
            raise OutOfMemory(f"cannot allocate a batch of {len(x)}")
        self.batches.append(len(x))
        self.shapes.append(x.shape)
        if self.poison is not None and bool((x == self.poison).any()):
            raise BackendError("poisoned input")
        outputs = {"y": x * 2 + 1, "total": x.sum(axis=1, keepdims=True)}
        return {name: outputs[name] for name in (output_names or outputs)}

    def memory_bytes(self) -> int | None:
        return None

    def release_after_next_run(self) -> None:
        self.released_after_runs = getattr(self, "released_after_runs", 0) + 1

    def interrupt(self) -> None:
        """Counted; when ``stoppable``, the run held at the gate ends with ORT's error."""
        self.interrupts += 1
        if self.stoppable:
            self._stop = True
            self.gate.set()

    def unload(self) -> None:
        self.unloaded = True
        self._held = None


@dataclass(eq=False)
class _Call:
    when_ns: int
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """The batcher's clock and timer at once; time moves only when the test calls ``advance``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns
        self._calls: list[_Call] = []

    def __call__(self) -> int:
        return self.now_ns

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> _Call:
        call = _Call(when_ns, callback)
        self._calls.append(call)
        return call

    @property
    def pending(self) -> list[int]:
        """When the scheduled, uncancelled callbacks are due."""
        return sorted(call.when_ns for call in self._calls if not call.cancelled)

    def advance(self, ns: int) -> None:
        """Move time forward and run the callbacks that fall due, in time order."""
        self.now_ns += ns
        due = sorted((c for c in self._calls if c.when_ns <= self.now_ns), key=lambda c: c.when_ns)
        self._calls = [c for c in self._calls if c.when_ns > self.now_ns and not c.cancelled]
        for call in due:
            if not call.cancelled:
                call.callback()
