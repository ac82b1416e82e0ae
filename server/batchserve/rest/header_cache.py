"""Binary requests that repeat a JSON header reuse its decoding.

A client sends the same JSON header with every request of one shape (tritonclient and
perf_analyzer build it from the input names, datatypes and shapes); only the binary section
changes. Parsing and checking that header is ~20 µs of the ~100 µs of Python each request
costs the event loop (bench/NOTES.md). When every input is binary data of a fixed-size
type, the decoded request depends only on the header's bytes and the body's length, so a
repeat needs nothing but new views of the new body at the same offsets.

Only requests that decoded without error are remembered: anything malformed takes the full
decoder every time and gets its message from there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from batchserve.datatypes import DataType
from batchserve.lru import LruCache
from batchserve.rest.codec import decode_infer_request
from batchserve.types import InferRequest, Parameters, RequestedOutput, Tensor

MAX_HEADER_BYTES = 4096
"""Longer JSON headers are decoded every time (and never held)."""
ENTRIES = 256
"""Headers remembered per server: a few per model and shape in practice."""

HeaderKey = tuple[str, str, bytes, int]
"""Model name, version, the JSON header's bytes and the whole body's length."""


@dataclass(frozen=True, slots=True)
class _BinaryInput:
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    parameters: Parameters

    def tensor(self, body: bytes) -> Tensor:
        """This input of ``body``, a read-only view as the full decoder gives."""
        data = np.ndarray(self.shape, self.dtype, body, self.offset)
        return Tensor(self.name, self.datatype, self.shape, data, dict(self.parameters))


@dataclass(frozen=True, slots=True)
class DecodedHeader:
    """What a header says, without the bytes that follow it; each request it decodes gets
    its own copies of what it may change (lists and dicts; the rest is immutable)."""

    key: HeaderKey
    inputs: tuple[_BinaryInput, ...]
    outputs: list[RequestedOutput] | None
    template: InferRequest
    """The first such request without its inputs: holding them would hold its body."""

    @classmethod
    def of(cls, key: HeaderKey, request: InferRequest) -> DecodedHeader | None:
        """The header of ``request``, when its inputs are all binary and of fixed size."""
        offset, inputs = len(key[2]), []
        for tensor in request.inputs:
            size = tensor.parameters.get("binary_data_size")
            if size is None or tensor.datatype.wire == "BYTES":
                return None
            inputs.append(
                _BinaryInput(tensor.name, tensor.datatype, tensor.shape, tensor.data.dtype,
                             offset, dict(tensor.parameters))
            )  # fmt: skip
            offset += size
        outputs = request.outputs
        template = replace(
            request, inputs=[], outputs=None, parameters=dict(request.parameters), layout=key
        )
        return cls(key, tuple(inputs), None if outputs is None else list(outputs), template)

    def request(self, body: bytes) -> InferRequest:
        """The request ``body`` (with this header) decodes to: views of its binary section."""
        template = self.template
        return InferRequest(
            model_name=template.model_name,
            model_version=template.model_version,
            id=template.id,
            inputs=[i.tensor(body) for i in self.inputs],
            outputs=None if self.outputs is None else list(self.outputs),
            parameters=dict(template.parameters) if template.parameters else {},
            priority=template.priority,
            timeout_us=template.timeout_us,
            binary_output=template.binary_output,
            protocol=template.protocol,
            layout=self.key,
        )


class HeaderCache:
    """``decode_infer_request`` for HTTP bodies, remembering the headers it has decoded."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._headers: LruCache[HeaderKey, DecodedHeader] = LruCache(entries)

    def decode(
        self, body: bytes, header_length: int | None, model_name: str, model_version: str
    ) -> InferRequest:
        if header_length is None or not 0 < header_length <= MAX_HEADER_BYTES:
            return decode_infer_request(body, header_length, model_name, model_version)
        key = (model_name, model_version, body[:header_length], len(body))
        known = self._headers.get(key)
        if known is not None:
            return known.request(body)
        request = decode_infer_request(body, header_length, model_name, model_version)
        decoded = DecodedHeader.of(key, request)
        if decoded is not None:
            self._headers.put(key, decoded)
            request.layout = key
        return request
