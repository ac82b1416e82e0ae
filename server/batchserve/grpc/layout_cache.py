"""gRPC requests that repeat a layout reuse its decoding (``dataplane/layouts.py``).

tritonclient and perf_analyzer send every input as ``raw_input_contents``; the rest of the
message (model, each input's name, datatype, shape and parameters, the requested outputs,
the request's parameters) is the same for every request of one shape. That rest, serialized,
with the size of each raw input, keys the decoded layout; a repeat gets views of its own raw
contents. The request id is read from each message, so it is not part of the key.
"""

from __future__ import annotations

from batchserve.core.types import InferRequest
from batchserve.core.validation import SchemaLookup
from batchserve.dataplane.layouts import ENTRIES, Layouts
from batchserve.grpc.codec import decode_infer_request
from batchserve.grpc.head import Request, head_of, raw_contents_of

MAX_KEY_BYTES = 4096
"""Messages whose rest serializes longer are decoded every time (and never held)."""

MessageKey = tuple[bytes, tuple[int, ...]]
"""The message serialized without its raw contents and id, and each raw input's size."""


class MessageLayouts:
    """``decode_infer_request`` for ModelInferRequest, remembering the layouts it has decoded."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._layouts = Layouts(entries)

    def decode(self, message: Request, schema: SchemaLookup | None = None) -> InferRequest:
        """Decode ``message``, which this may change (the server's own copy of the call). A
        repeated layout rebuilds views (nothing decoded, so ``schema`` is not needed); any
        other message takes the full decoder, which checks it against ``schema`` first."""
        raw = raw_contents_of(message)  # views, for a request off the wire (``head.py``)
        message = head_of(message)  # the server's own already is one
        if not raw or len(raw) != len(message.inputs):
            return decode_infer_request(message, schema, raw)
        request_id = message.id
        del message.raw_input_contents[:]  # a head given as one still holds them
        message.id = ""
        key: MessageKey = (message.SerializeToString(), tuple(map(len, raw)))
        message.id = request_id  # a stream's error answer names the request by it
        kept = len(key[0]) <= MAX_KEY_BYTES
        known = self._layouts.get(key) if kept else None
        if known is not None:
            return known.request(raw, request_id)
        request = decode_infer_request(message, schema, raw)  # the raw contents stay out
        if kept:
            self._layouts.remember(key, request, [0] * len(request.inputs))
        return request

    def __len__(self) -> int:
        return len(self._layouts)
