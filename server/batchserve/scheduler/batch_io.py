"""Triton's ragged batching: ragged inputs sent flat, tensors the batcher computes for the
model (``batch_input``), and outputs scattered back by an input's shape (``batch_output``).

A model that takes a batch of variable-length items without padding (a transformer over
packed tokens, a detector over point sets) reads them back to back with an index beside
them. Triton's semantics, which these follow (its backend library's
``backend_input_collector.cc`` and ``backend_output_responder.cc``, and the ONNX Runtime
backend's ``SetInputTensors``):

- an input with ``allow_ragged_batch``: requests whose shapes differ on it still share a
  batch; the model receives every request's elements back to back, as one 1-D tensor;
- each ``batch_input`` is computed per request (not per row) from its source input's shape:
  ``BATCH_ELEMENT_COUNT`` [requests] their element counts; ``BATCH_ACCUMULATED_ELEMENT_COUNT``
  [requests] the running sums; ``..._WITH_ZERO`` [requests + 1] the same after a 0;
  ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE`` [largest count], whose shape is what it says (its
  elements are zeros here, unset in Triton); ``BATCH_ITEM_SHAPE`` [rows, rank - 1] each row's
  shape past the batch axis; ``BATCH_ITEM_SHAPE_FLATTEN`` the same, flat;
- a ``BATCH_SCATTER_WITH_INPUT_SHAPE`` output is read flat, and each request takes the next
  elements of its own shape: the output's dims (the batch axis first when the model
  batches) with each -1 taken from its source input's shape on that axis.

Batch inputs depend on how the batch was cut into requests, so a batch of such a model is
never cut other than by requests (no rows of one request run apart), and a worker never
sends several requests to it as one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchserve.proto.model_config_pb2 import BatchInput, DataType, ModelConfig
from batchserve.scheduler.batching import Merged, split_outputs
from batchserve.scheduler.work import Arrays

_NUMPY = {DataType.TYPE_INT32: np.dtype(np.int32), DataType.TYPE_FP32: np.dtype(np.float32)}
"""The data types Triton allows a batch input."""


@dataclass(frozen=True, slots=True)
class ComputedInput:
    """One ``batch_input``: what it computes, into which model inputs, from which input."""

    kind: int
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str

    def compute(self, shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
        """The tensor, from each request's shape of the source input."""
        counts = [math.prod(shape) for shape in shapes]
        if self.kind == BatchInput.BATCH_ELEMENT_COUNT:
            values: np.ndarray = np.array(counts)
        elif self.kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT:
            values = np.cumsum(counts)
        elif self.kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
            values = np.concatenate([[0], np.cumsum(counts)])
        elif self.kind == BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
            values = np.zeros(max(counts, default=0))
        else:  # an item's shape per row: a request of b rows gives b rows
            rows = [row for shape in shapes for row in [shape[1:]] * shape[0]]
            rank = max(len(shape) - 1 for shape in shapes)
            values = np.array(rows).reshape(len(rows), rank)
            if self.kind == BatchInput.BATCH_ITEM_SHAPE_FLATTEN:
                values = values.reshape(-1)
        return values.astype(self.dtype, copy=False)


@dataclass(frozen=True, slots=True)
class ScatteredOutput:
    """One ``batch_output`` target: its shape per request, -1 where its source input says."""

    source: str
    shape: tuple[int, ...]

    def shape_for(self, source_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(
            source_shape[axis] if dim == -1 and axis < len(source_shape) else dim
            for axis, dim in enumerate(self.shape)
        )


@dataclass(frozen=True, slots=True)
class BatchIO:
    """How the batches of a model with ragged inputs, batch inputs or batch outputs are
    made and taken apart (the module docstring)."""

    ragged: frozenset[str]
    computed: tuple[ComputedInput, ...]
    scattered: tuple[tuple[str, ScatteredOutput], ...]
    """Each scattered output's name and rule."""

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchIO | None:
        """None for a model with none of them, whose batches are stacked as usual. The config
        is checked before a model loads (``models/batch_io_config.py``)."""
        ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        if not ragged and not config.batch_input and not config.batch_output:
            return None
        computed = tuple(
            ComputedInput(
                entry.kind, tuple(entry.target_name),
                _NUMPY.get(entry.data_type, _NUMPY[DataType.TYPE_INT32]),
                entry.source_input[0] if entry.source_input else "",
            )
            for entry in config.batch_input
        )  # fmt: skip
        dims = {tensor.name: tuple(tensor.dims) for tensor in config.output}
        batch = (-1,) if config.max_batch_size > 0 else ()
        scattered = tuple(
            (target, ScatteredOutput(entry.source_input[0], batch + dims[target]))
            for entry in config.batch_output
            for target in entry.target_name
            if entry.source_input and target in dims
        )
        return cls(ragged, computed, scattered)

    def merge(self, requests: Sequence[Arrays]) -> Merged:
        """The model's inputs for ``requests``: ragged inputs flat, the others stacked (their
        shapes past the batch axis agree: ``forming.same_shapes``), and the computed ones."""
        merged: Arrays = {}
        for name in requests[0]:
            arrays = [request[name] for request in requests]
            if name in self.ragged:
                merged[name] = np.concatenate([array.reshape(-1) for array in arrays])
            elif len(arrays) == 1:
                merged[name] = arrays[0]
            else:
                merged[name] = np.concatenate(arrays)
        elements = sum(array.size for array in merged.values())
        for entry in self.computed:
            tensor = entry.compute([request[entry.source].shape for request in requests])
            for target in entry.targets:
                merged[target] = tensor
        return Merged(merged, 0, elements)

    def split(
        self, outputs: Arrays, requests: Sequence[Arrays], rows: Sequence[int]
    ) -> list[Arrays]:
        """Each request's outputs: scattered ones by its source input's shape, the others by
        its rows."""
        scattered = {name: rule for name, rule in self.scattered if name in outputs}
        if not scattered:
            return split_outputs(outputs, rows)
        stacked = {name: array for name, array in outputs.items() if name not in scattered}
        parts = split_outputs(stacked, rows) if stacked else [{} for _ in requests]
        for name, rule in scattered.items():
            flat, offset = outputs[name].reshape(-1), 0
            for part, request in zip(parts, requests, strict=True):
                shape = rule.shape_for(request[rule.source].shape)
                size = math.prod(shape)
                part[name] = flat[offset : offset + size].reshape(shape)
                offset += size
        return parts

    def feed(self, batch: Arrays, batched: bool) -> Arrays:
        """The model's inputs for a stacked ``batch`` (a warm-up or probe batch), taken as
        requests of one row each, as Triton's warm-up sends its samples."""
        if not batched:
            return self.merge([batch]).arrays
        rows = next(iter(batch.values())).shape[0] if batch else 0
        requests = [
            {name: array[row : row + 1] for name, array in batch.items()} for row in range(rows)
        ]
        return self.merge(requests).arrays if requests else dict(batch)


def model_feed(config: ModelConfig, batch: Arrays) -> Arrays:
    """``batch`` as the model takes it: unchanged but for a model with ragged batching."""
    batch_io = BatchIO.from_config(config)
    if batch_io is None:
        return batch
    return batch_io.feed(batch, config.max_batch_size > 0)
