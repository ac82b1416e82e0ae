"""Input data decoded only once the request is known to be valid for its model.

Decoding BYTES elements, JSON ``data`` lists and typed gRPC contents builds Python objects
in proportion to the payload: 16 M empty BYTES elements took seconds of the event loop
before a datatype check refused them. So the full decoders work in two steps. First
everything the request's header says, all of it O(1) per tensor: names, datatypes, shapes,
byte sizes against element counts, binary_data_size against the body, element counts of
typed contents; fixed-size binary inputs become views there, which costs nothing. Then
``check_then_decode`` checks that header against the model (``validation.check_request``)
and only then decodes what was put off.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.tensors import Array, InputDataError, array_from_bytes
from batchserve.core.types import InferRequest, Parameters, Tensor
from batchserve.core.validation import SchemaLookup, check_request

Decoder = Callable[[], Array]

UNDECODED: Final = np.empty(0)
"""A put-off input's data until ``check_then_decode`` decodes it (validation reads none)."""


class PendingInputs:
    """The inputs of one request whose elements are yet to be decoded, and how."""

    __slots__ = ("_decoders",)

    def __init__(self) -> None:
        self._decoders: list[tuple[Tensor, Decoder]] = []

    def tensor(
        self,
        name: str,
        datatype: DataType,
        shape: tuple[int, ...],
        parameters: Parameters,
        decode: Decoder,
    ) -> Tensor:
        """The input, its data ``UNDECODED`` until ``decode`` runs."""
        tensor = Tensor(name, datatype, shape, UNDECODED, parameters)
        self._decoders.append((tensor, decode))
        return tensor

    def decode(self) -> None:
        for tensor, decode in self._decoders:
            tensor.data = decode()


def check_then_decode(
    request: InferRequest, pending: PendingInputs, schema: SchemaLookup | None
) -> InferRequest:
    """Check ``request`` against its model's schema (when given), keeping the verdict for
    validation, then decode the inputs put off; a data size that does not match its shape
    is found here, after the shapes, as Triton finds it, and named with the model."""
    if schema is not None:
        request.verdict = check_request(request.inputs, request.outputs, schema())
    try:
        pending.decode()
    except InputDataError as mismatch:
        raise mismatch.for_model(request.model_name) from None
    return request


def view_or_later(
    data: bytes | memoryview, datatype: DataType, shape: tuple[int, ...], *, tensor: str
) -> Array | Decoder:
    """A fixed-size input's view of its bytes, or, when their size does not match its shape,
    a decoder that says so once the shapes were checked against the model."""
    try:
        return array_from_bytes(data, datatype, shape, tensor=tensor)
    except InputDataError as mismatch:
        return partial(_raise, mismatch)


def _raise(error: Exception) -> Array:
    raise error
