"""`batchserve serve` with one model made to leak: the soak's proof that its memory check bites.

batchserve serves only ONNX and TensorRT files, so the leak lives in the backend: the real
backend is wrapped, and every batch it runs for the chosen model keeps a block of written
bytes for the life of the process. Everything else (protocols, batcher, statistics) is the
real server, built through the same ``batchserve.runtime.app.run`` as ``batchserve serve``.

    python -m bench.leaky_server [--leak-model digits_cnn] [--leak-kib 64] SERVE_FLAGS...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from batchserve.backends.base import Arrays, Backend
from batchserve.backends.selection import create_backend
from batchserve.core.device import Device
from batchserve.core.signature import ModelSignature
from batchserve.models.registry import BackendFactory
from batchserve.observability.logs import configure_logging
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.runtime.app import run
from batchserve.runtime.serve_command import register, settings_from_args

RETAINED: list[bytes] = []  # the leak: never cleared while the server runs


class LeakyBackend:
    """A backend that runs batches as ``inner`` does and keeps ``leak_bytes`` after each."""

    def __init__(self, inner: Backend, leak_bytes: int) -> None:
        self._inner = inner
        self._leak_bytes = leak_bytes

    @property
    def device(self) -> Device:
        return self._inner.device

    @property
    def signature(self) -> ModelSignature:
        return self._inner.signature

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        self._inner.load(model_file, config, device)

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        outputs = self._inner.infer(inputs, output_names)
        RETAINED.append(b"\xa5" * self._leak_bytes)  # written, so resident: not a lazy zero page
        return outputs

    def memory_bytes(self) -> int | None:
        return self._inner.memory_bytes()

    def release_after_next_run(self) -> None:
        self._inner.release_after_next_run()

    def interrupt(self) -> None:
        self._inner.interrupt()

    def unload(self) -> None:
        self._inner.unload()


def leaky_factory(model: str, leak_bytes: int) -> BackendFactory:
    """The server's usual backends, with ``model``'s wrapped in a LeakyBackend."""

    def create(config: ModelConfig, model_file: Path) -> Backend:
        backend = create_backend(config, model_file)
        return LeakyBackend(backend, leak_bytes) if config.name == model else backend

    return create


def main(argv: Sequence[str] | None = None) -> int:
    """Leak options first; every other flag is `batchserve serve`'s own."""
    own = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    own.add_argument("--leak-model", default="digits_cnn", help="the model that leaks")
    own.add_argument("--leak-kib", type=int, default=64, help="KiB kept after each batch")
    leak, rest = own.parse_known_args(argv)
    serve = argparse.ArgumentParser(prog="leaky_server")
    register(serve.add_subparsers())
    args = serve.parse_args(["serve", *rest])
    settings = settings_from_args(args)
    configure_logging(settings.log_level, settings.log_format)
    run(settings, leaky_factory(leak.leak_model, leak.leak_kib * 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
