"""HTTP binary requests that repeat a JSON header reuse its decoding (``dataplane/layouts.py``).

When every input is binary data (``binary_data_size``), the decoded request depends only on
the header's bytes and the body's length: inputs follow the header in order, so a repeat
only needs views of the new body at the same offsets.
"""

from __future__ import annotations

from batchserve.core.types import InferRequest
from batchserve.core.validation import SchemaLookup
from batchserve.dataplane.layouts import ENTRIES, Layouts
from batchserve.rest.codec import decode_infer_request

MAX_HEADER_BYTES = 4096
"""Longer JSON headers are decoded every time (and never held)."""

HeaderKey = tuple[str, str, bytes, int]
"""Model name, version, the JSON header's bytes and the whole body's length."""


class HeaderCache:
    """``decode_infer_request`` for HTTP bodies, remembering the headers it has decoded."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._layouts = Layouts(entries)

    def decode(
        self,
        body: bytes,
        header_length: int | None,
        model_name: str,
        model_version: str,
        schema: SchemaLookup | None = None,
    ) -> InferRequest:
        """A repeated header rebuilds views (nothing decoded, so ``schema`` is not needed);
        any other body takes the full decoder, which checks it against ``schema`` first."""
        if header_length is None or not 0 < header_length <= MAX_HEADER_BYTES:
            return decode_infer_request(body, header_length, model_name, model_version, schema)
        key: HeaderKey = (model_name, model_version, body[:header_length], len(body))
        known = self._layouts.get(key)
        if known is not None:
            return known.request([body] * len(known.inputs), known.template.id)
        request = decode_infer_request(body, header_length, model_name, model_version, schema)
        offsets = _binary_offsets(request, header_length)
        if offsets is not None:
            self._layouts.remember(key, request, offsets)
        return request

    def __len__(self) -> int:
        return len(self._layouts)


def _binary_offsets(request: InferRequest, header_length: int) -> list[int] | None:
    """Where each input starts in the body when all are binary (one after another, after
    the header, as the decoder read them); None when any is not."""
    offsets, offset = [], header_length
    for tensor in request.inputs:
        size = tensor.parameters.get("binary_data_size")
        if size is None:
            return None
        offsets.append(offset)
        offset += size
    return offsets
