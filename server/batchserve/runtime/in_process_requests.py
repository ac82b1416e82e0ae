"""numpy in, numpy out: the in-process API's requests and responses as the dataplane takes
and gives them (``in_process.py`` runs them).

An in-process caller hands over arrays, not wire bytes, so this is the whole codec: each
array becomes a ``Tensor`` (its dtype read as the protocol's datatype), the keyword options
become the request parameters both network protocols carry, and those go through the same
``request_options`` check, so a bad priority or sequence id is refused in the same words.
Everything checked against the model (names, datatypes, shapes, outputs) is left to the
dataplane, once for every path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypedDict, Unpack

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import BY_WIRE, BYTES, DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import (
    check_count,
    check_unique,
    checked_shape,
    class_count,
    describe,
)
from batchserve.core.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    request_options,
)

Array = npt.NDArray[Any]
Outputs = dict[str, Array]

PROTOCOL: Final = "in_process"
"""The protocol an in-process request is counted under (statistics' per-protocol outcomes)."""


class StreamOptions(TypedDict, total=False):
    """The keyword options of one request, as both network protocols carry them."""

    version: str | int
    outputs: Sequence[str] | None
    request_id: str
    priority: int | None
    timeout_us: int | None
    sequence_id: int | str | None
    sequence_start: bool
    sequence_end: bool
    parameters: Mapping[str, object] | None


class InferOptions(StreamOptions, total=False):
    """A single-answer request's options: also Triton's classification extension."""

    classification: Mapping[str, int] | None


def infer_request(
    model: str, inputs: Mapping[str, object], **options: Unpack[InferOptions]
) -> InferRequest:
    """The request the network adapters would have decoded from the same call.

    ``classification`` asks for an output's k largest entries (Triton's classification
    extension) and requests that output; the keyword options win over the same keys in
    ``parameters``, which carries any other request parameter unchanged.
    """
    if not isinstance(model, str) or not model:
        raise InvalidArgument(f"model name must be a non-empty string, got {describe(model)}")
    if not isinstance(inputs, Mapping):
        raise InvalidArgument(
            f"inputs must be a mapping of input name to array, got {describe(inputs)}"
        )
    if unknown := options.keys() - InferOptions.__optional_keys__:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    check_count(len(inputs), what="input")
    tensors = [input_tensor(name, value) for name, value in inputs.items()]
    checked = request_options(_parameters(options))
    requested = requested_outputs(options.get("outputs"), options.get("classification"))
    return InferRequest(
        model_name=model,
        model_version=str(options.get("version", "")),
        id=options.get("request_id", ""),
        inputs=tensors,
        outputs=requested,
        parameters=checked.parameters,
        priority=checked.priority,
        timeout_us=checked.timeout_us,
        protocol=PROTOCOL,
        layout=layout_key(tensors, requested),
        sequence=checked.sequence,
        empty_final=checked.empty_final,
    )


def layout_key(
    inputs: Sequence[Tensor], outputs: Sequence[RequestedOutput] | None
) -> tuple[object, ...]:
    """What validation depends on (input names, datatypes and shapes; the outputs asked
    for): a repeat reuses the verdict its model's schema keeps for it, as a repeat of a
    network client's request does (``dataplane/layouts.py``)."""
    described = tuple((t.name, t.datatype.wire, t.shape) for t in inputs)
    asked = None if outputs is None else tuple((o.name, o.classification) for o in outputs)
    return (PROTOCOL, described, asked)


def _parameters(options: InferOptions) -> dict[str, object]:
    """The keyword options under the names both protocols give them (``timeout`` is in
    microseconds there too); a flag left False is not sent, as a client omits it."""
    parameters = dict(options.get("parameters") or {})
    named: dict[str, object | None] = {
        "priority": options.get("priority"),
        "timeout": options.get("timeout_us"),
        "sequence_id": options.get("sequence_id"),
        "sequence_start": options.get("sequence_start") or None,
        "sequence_end": options.get("sequence_end") or None,
    }
    parameters.update({key: value for key, value in named.items() if value is not None})
    return parameters


def input_tensor(name: object, value: object) -> Tensor:
    """One input as the codecs hand it to the dataplane: a C-contiguous, native-endian array
    whose dtype names its datatype; strings as BYTES (object arrays of ``bytes``)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"input names must be non-empty strings, got {describe(name)}")
    array = _native(name, np.asarray(value))
    datatype = BYTES if array.dtype.kind == "O" else _BY_DTYPE.get(array.dtype)
    if datatype is None:
        raise InvalidArgument(
            f"input '{name}': numpy dtype {array.dtype} has no protocol datatype (send bool, "
            "(u)int8-64, float16-64, or bytes/str for BYTES)"
        )
    shape = checked_shape(array.shape, tensor=name)
    return Tensor(name, datatype, shape, array)


_BY_DTYPE: Final[dict[np.dtype[Any], DataType]] = {
    d.numpy: d for d in BY_WIRE.values() if d.wire not in ("BF16", "BYTES")
}
"""Each numpy dtype's datatype (BF16 has none; BYTES arrays are object arrays)."""


def _native(name: str, array: Array) -> Array:
    kind = array.dtype.kind
    if kind in "USO":
        return _bytes_array(name, array)
    if not array.dtype.isnative:  # the backends, as the codecs' views, take native order
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _bytes_array(name: str, array: Array) -> Array:
    """str and bytes elements as the object array of ``bytes`` both codecs decode BYTES to."""
    flat = array.ravel()
    elements: list[bytes] = []
    for element in flat.tolist() if array.dtype.kind != "O" else flat:
        if isinstance(element, str):
            elements.append(element.encode("utf-8"))
        elif isinstance(element, bytes):
            elements.append(element)
        else:
            raise InvalidArgument(
                f"input '{name}': a BYTES element must be bytes or str, got {describe(element)}"
            )
    converted = np.empty(len(elements), dtype=np.object_)
    converted[:] = elements
    return converted.reshape(array.shape)


def requested_outputs(
    names: Sequence[str] | None, classification: Mapping[str, int] | None
) -> list[RequestedOutput] | None:
    """The outputs asked for, in the order given; None (every output) when none is named."""
    if isinstance(names, str):
        raise InvalidArgument(f"outputs must be a sequence of output names, got {describe(names)}")
    counts = dict(classification or {})
    requested = []
    for name in [*(names or ()), *(name for name in counts if name not in (names or ()))]:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"output names must be non-empty strings, got {describe(name)}")
        k = class_count(counts[name], tensor=name) if name in counts else 0
        requested.append(RequestedOutput(name, classification=k))
    check_count(len(requested), what="output")
    check_unique([output.name for output in requested], what="output")
    return requested or None


def response_outputs(response: InferResponse) -> Outputs:
    """A response's tensors by name, in the order the model (or the request) gave them."""
    return {tensor.name: tensor.data for tensor in response.outputs}
