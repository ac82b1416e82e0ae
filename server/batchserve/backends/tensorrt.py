"""TensorRT backend: a deserialised engine with one execution context and CUDA stream per instance.

The engine is read in ``tensorrt_engine``; what an instance owns on the GPU (contexts per
optimisation profile, buffers sized once, CUDA graphs per preferred batch size when
``optimization { cuda { graphs: true } }``) and how it runs a batch is ``tensorrt_instance``.
``tensorrt`` and cuda-python are imported inside functions; without them, or without a GPU,
load says which is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.backends.gpu_plan import graph_batch_sizes
from batchserve.backends.tensorrt_engine import (
    deserialize,
    engine_signature,
    require_gpu,
)
from batchserve.backends.tensorrt_instance import EngineInstance, open_instance
from batchserve.backends.tensorrt_profiles import check_inputs, instance_profiles
from batchserve.core.device import CPU, Device
from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    InvalidArgument,
    OutOfMemory,
)
from batchserve.core.signature import ModelSignature
from batchserve.devices import cuda
from batchserve.proto.model_config_pb2 import ModelConfig

__all__ = ["TensorRTBackend", "map_trt_errors"]

_log = logging.getLogger(__name__)


@contextmanager
def map_trt_errors(where: str) -> Iterator[None]:
    """The one boundary for TensorRT's exceptions (most of its failures are False or None)."""
    try:
        yield
    except BatchserveError:
        raise
    except MemoryError as exc:
        raise OutOfMemory(f"{where}: out of host memory") from exc
    except Exception as exc:
        error = OutOfMemory if "out of memory" in str(exc).lower() else BackendError
        raise error(f"{where}: {type(exc).__name__}: {exc}") from exc


class TensorRTBackend:
    """One TensorRT execution context on one GPU.

    Args:
        profile: the one optimisation profile to use; None takes the instance group's
            ``profile`` list, else every profile of the engine, and picks one per batch.
    """

    def __init__(self, *, profile: int | None = None) -> None:
        self._profile = profile
        self._instance: EngineInstance | None = None
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
        return () if self._instance is None else tuple(sorted(self._instance.graphs))

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        trt = require_gpu(model_file, device)
        self._name = config.name or model_file.stem
        sizes = graph_batch_sizes(config, model_file)
        with map_trt_errors(str(model_file)):
            cuda.set_device(device.index)
            runtime, engine = deserialize(trt, model_file)
            profiles: tuple[int, ...] = (self._profile,) if self._profile is not None else ()
            if not profiles:
                count = engine.num_optimization_profiles
                profiles = instance_profiles(config, device, count, model_file)
            busy_wait = config.optimization.cuda.busy_wait_events
            instance = open_instance(trt, runtime, engine, profiles, model_file, busy_wait)
            try:
                for warning in instance.capture_graphs(trt, sizes, model_file):
                    _log.warning(warning)
                self._signature = engine_signature(trt, engine, model_file)
            except BaseException:
                instance.close()
                raise
        self._instance, self._device = instance, device

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        instance = self._loaded()
        tensors = list(instance.tensors.values())
        check_inputs(tensors, inputs, self._name)
        names = list(output_names or (t.name for t in tensors if not t.is_input))
        unknown = [n for n in names if n not in instance.tensors or instance.tensors[n].is_input]
        if unknown:
            raise InvalidArgument(f"model '{self._name}': unknown outputs {unknown}")
        with map_trt_errors(f"model '{self._name}'"):
            cuda.set_device(self._device.index)  # CUDA's current device is per thread
            return instance.run(inputs, names, self._name)

    def memory_bytes(self) -> int | None:
        return None if self._instance is None else self._instance.memory_bytes()

    def release_after_next_run(self) -> None:
        """Nothing to give back: an engine's memory is allocated once, for its profiles'
        largest shapes, and a larger request is refused by the profile."""

    def interrupt(self) -> None:
        """An enqueued engine runs to its end: TensorRT has no way to stop it."""

    def unload(self) -> None:
        instance, self._instance = self._instance, None
        if instance is not None:
            cuda.set_device(self._device.index)
            instance.close()

    def _loaded(self) -> EngineInstance:
        if self._instance is None:
            raise BackendError(f"model '{self._name}' is not loaded")
        return self._instance
