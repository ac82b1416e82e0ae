"""Triton's ``reshape``: clients send and receive ``dims``, the model sees ``reshape.shape``.

Applied once, around whichever runtime serves the model (``create_backend``), so ONNX
Runtime, TensorRT and torch.export models all get it, and everything above the backend
(validation, batching, warm-up, the memory probe, metadata) speaks ``dims`` only. When the
model batches, both shapes are per sample: the batch axis stays in front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from batchserve.backends.base import Arrays, Backend
from batchserve.core.device import Device
from batchserve.core.errors import InvalidArgument
from batchserve.core.signature import ModelSignature, TensorSpec
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput

Shape = tuple[int, ...]
Shapes = dict[str, tuple[Shape, Shape]]
"""tensor name -> (the shape it arrives in, the shape to give it), per sample, -1 free."""


def reshapes(config: ModelConfig) -> tuple[Shapes, Shapes]:
    """(inputs, outputs) with a ``reshape``: inputs go dims -> reshape, outputs back."""
    inputs = {
        t.name: (tuple(t.dims), tuple(t.reshape.shape))
        for t in config.input
        if t.HasField("reshape")
    }
    outputs = {
        t.name: (tuple(t.reshape.shape), tuple(t.dims))
        for t in config.output
        if t.HasField("reshape")
    }
    return inputs, outputs


def target_shape(shape: Shape, source: Shape, target: Shape) -> Shape:
    """``target`` with its k-th -1 set to the size ``shape`` has at ``source``'s k-th -1
    (Triton pairs free axes in order; config validation checked the fixed sizes between)."""
    free = iter(size for size, dim in zip(shape, source, strict=False) if dim == -1)
    return tuple(next(free, 1) if dim == -1 else dim for dim in target)


def scalar_as_ones(tensor: ModelInput | ModelOutput, spec: TensorSpec, *, batched: bool) -> bool:
    """Triton's rule for a model that does not batch: a tensor the model takes or gives as a
    scalar may be written with dims all 1 (``dims: [1]``, as Triton completes it), and clients
    send and receive those dims. Triton refuses ``reshape: { shape: [ ] }`` there."""
    return not batched and not spec.shape and _ones(tensor)


def _ones(tensor: ModelInput | ModelOutput) -> bool:
    """Dims all 1 and no reshape: what a scalar may be written as."""
    dims = tensor.dims
    return not tensor.HasField("reshape") and bool(dims) and all(size == 1 for size in dims)


def scalar_reshapes(config: ModelConfig, signature: ModelSignature) -> tuple[Shapes, Shapes]:
    """(inputs, outputs) that ``scalar_as_ones`` reshapes: dims to a scalar, and back."""
    batched = config.max_batch_size > 0
    scalar: Shape = ()
    specs = {spec.name: spec for spec in signature.inputs + signature.defaulted}
    inputs: Shapes = {
        t.name: (tuple(t.dims), scalar)
        for t in config.input
        if t.name in specs and scalar_as_ones(t, specs[t.name], batched=batched)
    }
    specs = {spec.name: spec for spec in signature.outputs}
    outputs: Shapes = {
        t.name: (scalar, tuple(t.dims))
        for t in config.output
        if t.name in specs and scalar_as_ones(t, specs[t.name], batched=batched)
    }
    return inputs, outputs


def _may_hold_scalars(config: ModelConfig) -> bool:
    """Whether ``scalar_as_ones`` may apply once the model's signature is known."""
    tensors: list[ModelInput | ModelOutput] = [*config.input, *config.output]
    return config.max_batch_size <= 0 and any(_ones(t) for t in tensors)


def with_reshape(backend: Backend, config: ModelConfig) -> Backend:
    """``backend`` itself when no tensor has a reshape and none can be a scalar written as
    dims of 1, else a ``ReshapedBackend``."""
    inputs, outputs = reshapes(config)
    if not inputs and not outputs and not _may_hold_scalars(config):
        return backend
    return ReshapedBackend(backend, inputs, outputs, batched=config.max_batch_size > 0)


def reshaped(
    array: np.ndarray, shapes: tuple[Shape, Shape], batched: bool, what: str
) -> np.ndarray:
    batch = array.shape[:1] if batched else ()
    target = batch + target_shape(array.shape[len(batch) :], *shapes)
    try:
        return array.reshape(target)
    except ValueError:
        raise InvalidArgument(
            f"{what}: shape {list(array.shape)} cannot be reshaped to {list(target)} "
            "(the config's reshape)"
        ) from None


class ReshapedBackend:
    """A backend whose named inputs and outputs are reshaped on the way in and out."""

    def __init__(self, inner: Backend, inputs: Shapes, outputs: Shapes, *, batched: bool) -> None:
        self.inner = inner
        self._inputs, self._outputs, self._batched = inputs, outputs, batched

    @property
    def device(self) -> Device:
        return self.inner.device

    @property
    def signature(self) -> ModelSignature:
        return self.inner.signature

    @property
    def declared_memory(self) -> Callable[[], tuple[int, int]] | None:
        """The inner backend's, where it declares its memory (``memory_probe``)."""
        declared: Callable[[], tuple[int, int]] | None
        declared = getattr(self.inner, "declared_memory", None)
        return declared

    @property
    def backend_counters(self) -> Callable[[], list[tuple[str, str, int]]] | None:
        """The inner backend's own metric families, where it has any (``triton_metrics``)."""
        counters: Callable[[], list[tuple[str, str, int]]] | None
        counters = getattr(self.inner, "backend_counters", None)
        return counters

    @property
    def number_instance(self) -> Callable[[int], None] | None:
        """The inner backend's, where it tells its instances apart (``instance_loader``)."""
        number: Callable[[int], None] | None = getattr(self.inner, "number_instance", None)
        return number

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self.inner, "graph_batch_sizes", ()))

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        self.inner.load(model_file, config, device)
        inputs, outputs = scalar_reshapes(config, self.inner.signature)
        self._inputs, self._outputs = self._inputs | inputs, self._outputs | outputs

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        if not self._inputs and not self._outputs:  # dims of 1 that were not scalars after all
            return self.inner.infer(inputs, output_names)
        fed = {
            name: reshaped(array, self._inputs[name], self._batched, f"input '{name}'")
            if name in self._inputs
            else array
            for name, array in inputs.items()
        }
        outputs = self.inner.infer(fed, output_names)
        for name, shapes in self._outputs.items():
            if name in outputs:
                outputs[name] = reshaped(outputs[name], shapes, self._batched, f"output '{name}'")
        return outputs

    def memory_bytes(self) -> int | None:
        return self.inner.memory_bytes()

    def release_after_next_run(self) -> None:
        self.inner.release_after_next_run()

    def interrupt(self) -> None:
        self.inner.interrupt()

    def unload(self) -> None:
        self.inner.unload()
