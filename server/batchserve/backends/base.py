"""The contract every runtime implements, and nothing more.

Backends know nothing of batching, protocols or metrics: they load one model file
onto one device, run one batch synchronously (the scheduler calls them from a
worker thread; ONNX Runtime and TensorRT release the GIL), and release it.
Each backend translates its runtime's exceptions into ``batchserve.core.errors`` at
one boundary, so ``OutOfMemory`` means the same thing whatever the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from batchserve.core.device import Device
from batchserve.core.signature import ModelSignature
from batchserve.proto.model_config_pb2 import ModelConfig

Arrays = Mapping[str, np.ndarray]


class Backend(Protocol):
    """One loaded model instance on one device."""

    @property
    def device(self) -> Device:
        """Where the instance runs (after any execution-provider choice)."""
        ...

    @property
    def signature(self) -> ModelSignature:
        """Inputs and outputs as the runtime sees them."""
        ...

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        """Load the file; raise DeviceUnavailable / BackendError / ModelConfigError."""
        ...

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one batch; ``output_names`` None means every output."""
        ...

    def memory_bytes(self) -> int | None:
        """Device memory this instance holds now, or None where the runtime cannot tell."""
        ...

    def release_after_next_run(self) -> None:
        """The next run takes memory lent beyond the instance's reservation: once it ends,
        give back what the runtime would keep of it (ONNX Runtime's arena, torch's caching
        allocator), so that the memory returns with the loan. Others keep nothing."""
        ...

    def interrupt(self) -> None:
        """Called from another thread: end the run in progress, whose clients all went
        away, if the runtime can (ONNX Runtime between two nodes; the run then raises).
        Nothing when no run is in progress, nor where the runtime cannot stop a run."""
        ...

    def unload(self) -> None:
        """Release the session/engine and its buffers; safe to call twice."""
        ...
