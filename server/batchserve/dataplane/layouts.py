"""Requests that repeat a layout reuse its decoding: only the tensor bytes are new.

A client sends the same description of its tensors (names, datatypes, shapes, requested
outputs, parameters) with every request of one shape; tritonclient and perf_analyzer build it
once per shape. Only the bytes of the tensors change. Decoding and checking that description
costs ~20 µs of Python a request (bench/NOTES.md), so each protocol keys a request by its
description (``rest/header_cache.py``: the JSON header's bytes; ``grpc/layout_cache.py``: the
message without its raw contents) and rebuilds a repeat from a ``DecodedLayout``: new
read-only views of the new bytes, nothing parsed. The key is also the request's ``layout``,
with which validation reuses its verdict (``RequestSchema.passed``).

Only requests that decoded without error are remembered: anything malformed takes the full
decoder every time and gets its message from there.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.lru import LruCache
from batchserve.core.types import InferRequest, Parameters, Tensor

ENTRIES = 256
"""Layouts remembered per protocol and server: a few per model and shape in practice."""


@dataclass(frozen=True, slots=True)
class InputView:
    """One input of a layout: what its bytes are, not the bytes."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    dtype: np.dtype
    parameters: Parameters
    offset: int
    """Where the input starts in its buffer."""

    def tensor(self, buffer: bytes | memoryview) -> Tensor:
        """The input in ``buffer``, a read-only view as the full decoders give."""
        data = np.ndarray(self.shape, self.dtype, buffer, self.offset)
        return Tensor(self.name, self.datatype, self.shape, data, dict(self.parameters))


@dataclass(frozen=True, slots=True)
class DecodedLayout:
    """What a layout says; each request rebuilt from it gets its own copies of what it may
    change (lists and dicts; the rest is immutable)."""

    inputs: tuple[InputView, ...]
    template: InferRequest
    """The first such request without its inputs (holding them would hold its bytes), marked
    with the layout's key."""

    @classmethod
    def of(
        cls, key: Hashable, request: InferRequest, offsets: Sequence[int]
    ) -> DecodedLayout | None:
        """The layout of ``request``, whose inputs start at ``offsets`` in their buffers;
        None when an input is BYTES, which is parsed, not viewed."""
        if any(tensor.datatype.wire == "BYTES" for tensor in request.inputs):
            return None
        inputs = tuple(
            InputView(t.name, t.datatype, t.shape, t.data.dtype, dict(t.parameters), offset)
            for t, offset in zip(request.inputs, offsets, strict=True)
        )
        template = replace(
            request,
            inputs=[],
            outputs=None if request.outputs is None else list(request.outputs),
            parameters=dict(request.parameters),
            layout=key,
            verdict=None,  # repeats are validated by their layout; holding it holds a schema
        )
        return cls(inputs, template)

    def request(self, buffers: Sequence[bytes | memoryview], request_id: str) -> InferRequest:
        """The request whose inputs are in ``buffers`` (one per input, in input order)."""
        template = self.template
        return InferRequest(
            model_name=template.model_name,
            model_version=template.model_version,
            id=request_id,
            inputs=[view.tensor(buffer) for view, buffer in zip(self.inputs, buffers, strict=True)],
            outputs=None if template.outputs is None else list(template.outputs),
            parameters=dict(template.parameters) if template.parameters else {},
            priority=template.priority,
            timeout_us=template.timeout_us,
            binary_output=template.binary_output,
            protocol=template.protocol,
            layout=template.layout,
            sequence=template.sequence,
            empty_final=template.empty_final,
        )


class Layouts:
    """Decoded layouts by their protocol's key, the least recently used dropped first."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._layouts: LruCache[Hashable, DecodedLayout] = LruCache(entries)

    def get(self, key: Hashable) -> DecodedLayout | None:
        return self._layouts.get(key)

    def remember(self, key: Hashable, request: InferRequest, offsets: Sequence[int]) -> None:
        """Keep the layout of ``request`` (just decoded in full) under ``key`` and mark the
        request with it, when its inputs can be viewed (``DecodedLayout.of``)."""
        layout = DecodedLayout.of(key, request, offsets)
        if layout is not None:
            self._layouts.put(key, layout)
            request.layout = key

    def __len__(self) -> int:
        return len(self._layouts)
