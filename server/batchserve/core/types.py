"""The protocol-free request and response that both adapters translate to and from, and the
request-level options both protocols carry as the same named parameters.

Tensors carry numpy arrays: zero-copy views of the request bytes where the wire
allows (binary HTTP bodies, gRPC raw contents), object arrays of ``bytes`` for BYTES.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import describe

Parameters = dict[str, Any]

_SEQUENCE_KEYS: Final = ("sequence_id", "sequence_start", "sequence_end")
MAX_SEQUENCE_ID_CHARS: Final = 256
"""A string correlation id is kept while its sequence lives: its length is bounded."""
# The one reserved key Triton allows: a decoupled model's bare final flag is sent to the
# client as an empty response only when the request asks (perf_analyzer always does)
_EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"


@dataclass(slots=True)
class Tensor:
    """One named tensor; ``data.shape`` equals ``shape``.

    Args:
        name: tensor name as the model declares it.
        datatype: element type (protocol, config and numpy spellings).
        shape: full shape including any batch axis.
        data: the elements; for BYTES an object array of ``bytes``.
        parameters: per-tensor protocol parameters (e.g. ``binary_data_size``).
        in_shared_memory: an output already written into the client's shared-memory
            region: the codecs send its metadata but no data.
    """

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)
    in_shared_memory: bool = False


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for by name.

    Args:
        name: output tensor name.
        binary: HTTP only: send as binary data (``binary_data`` parameter); None = default.
        classification: k of the classification extension (its k largest entries, as
            BYTES); 0 = the tensor itself.
        parameters: the output's protocol parameters (``shared_memory_region`` ...).
    """

    name: str
    binary: bool | None = None
    classification: int = 0
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)  # not frozen: a frozen dataclass takes 3x as long to build
class Verdict:
    """A request found valid for a model from its header alone, before its data was decoded.

    Args:
        schema: the model's ``validation.RequestSchema`` it was checked against; validation
            trusts the verdict only for that very schema (a reload makes a new one).
        batch_size: the batch size the inputs imply.
        output_names: the outputs to send back.
    """

    schema: object
    batch_size: int
    output_names: tuple[str, ...]


@dataclass(slots=True, weakref_slot=True)  # shared-memory holds end with it (``tensors.hold``)
class InferRequest:
    """An inference request after decoding, before validation against the model.

    Args:
        model_name: target model.
        model_version: "" lets the version policy pick (the highest served version).
        id: client-chosen id echoed in the response.
        inputs: input tensors, in wire order.
        outputs: requested outputs; None means every output.
        parameters: request-level protocol parameters.
        priority: 0 means the model's default level; 1 is the highest.
        timeout_us: 0 means the model's default queue timeout.
        binary_output: HTTP only: default for outputs without an explicit ``binary_data``.
        is_cancelled: returns True once the client has gone away.
        protocol: "http" or "grpc", for the per-protocol request counts.
        layout: equal for requests whose inputs have the same names, datatypes and shapes
            and that ask for the same outputs, None when unknown: a validation one of them
            passed holds for all (set by the layout caches of both protocols,
            ``dataplane/layouts.py``).
        verdict: set by a decoder that checked the request against its model before
            decoding its data (``deferred.py``); validation then need not check it again.
        peer: the client's address, kept by a worker process for the model-owning process,
            which reads inputs in shared memory only for clients that may name regions.
        sequence: the request's place in a stateful sequence (Triton's ``sequence_id``,
            ``sequence_start``, ``sequence_end``); None when it names none.
        empty_final: a decoupled model's final flag without outputs is sent as an empty
            response (``triton_enable_empty_final_response``), else not sent.
    """

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    binary_output: bool = False
    is_cancelled: Callable[[], bool] | None = None
    protocol: str = ""
    layout: Hashable | None = None
    verdict: Verdict | None = None
    peer: str | None = None
    sequence: SequenceFlags | None = None
    empty_final: bool = False


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """Where a request stands in a sequence: its correlation id (a non-zero integer or a
    non-empty string) and whether it starts or ends the sequence."""

    id: int | str
    start: bool = False
    end: bool = False

    def as_tuple(self) -> tuple[int | str, bool, bool]:
        """For the hand-off frames, which carry built-in types only."""
        return (self.id, self.start, self.end)


@dataclass(slots=True)
class InferResponse:
    """The answer to one request, outputs in the order requested (or model order).

    ``final`` is False on all but the last of a decoupled model's responses to a request.
    """

    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    parameters: Parameters = field(default_factory=dict)
    final: bool = True


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """A tensor as model metadata describes it; -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What `GET /v2/models/<name>` and gRPC ModelMetadata return."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """What `GET /v2` and gRPC ServerMetadata return."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(slots=True)
class RequestOptions:
    """Request-level parameters with a meaning, split from the ones passed through.

    Args:
        priority: 0 = the model's default level.
        timeout_us: 0 = the model's default queue timeout.
        binary_output: HTTP ``binary_data_output``.
        parameters: every other key, unchanged.
        sequence: ``sequence_id`` with ``sequence_start`` and ``sequence_end``; None when
            the id is absent, 0 or empty (Triton: no sequence).
        empty_final: ``triton_enable_empty_final_response``.
    """

    priority: int
    timeout_us: int
    binary_output: bool
    parameters: dict[str, Any]
    sequence: SequenceFlags | None = None
    empty_final: bool = False


def request_options(parameters: Mapping[str, object], *, http: bool = False) -> RequestOptions:
    """Split priority, timeout and binary_data_output from the other request parameters.
    ``http``: Triton's HTTP front end takes no 'triton_' key at all, its gRPC one takes
    triton_enable_empty_final_response; each refuses the others in its own words."""
    if not parameters:
        return RequestOptions(0, 0, False, {})
    rest = dict(parameters)
    reserved = next(
        (k for k in rest if k.startswith("triton_") and (http or k != _EMPTY_FINAL_RESPONSE)),
        None,
    )
    if reserved is not None:
        words = (
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified."
            if http
            else "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
            f"the following keys starting with 'triton_' are allowed: {_EMPTY_FINAL_RESPONSE}"
        )
        raise InvalidArgument(f"{words} (batchserve: request parameter {reserved[:64]!r})")
    empty_final = rest.pop(_EMPTY_FINAL_RESPONSE, False)
    if type(empty_final) is not bool:
        raise InvalidArgument(
            f"invalid value type for '{_EMPTY_FINAL_RESPONSE}' parameter, expected bool_param."
        )
    sequence = _sequence(rest)
    priority = _unsigned(rest.pop("priority", 0), "priority")
    timeout = _unsigned(rest.pop("timeout", 0), "timeout")
    binary = rest.pop("binary_data_output", False)
    if type(binary) is not bool:
        raise InvalidArgument(
            f"request parameter 'binary_data_output' must be true or false, got {describe(binary)}"
        )
    return RequestOptions(priority, timeout, binary, rest, sequence, empty_final)


def _sequence(rest: dict[str, object]) -> SequenceFlags | None:
    """Take the sequence keys out of ``rest``: the flags, or None without an id."""
    if not any(key in rest for key in _SEQUENCE_KEYS):
        return None
    sequence_id = rest.pop("sequence_id", 0)
    flags = [rest.pop(key, False) for key in _SEQUENCE_KEYS[1:]]
    for key, flag in zip(_SEQUENCE_KEYS[1:], flags, strict=True):
        if type(flag) is not bool:
            raise InvalidArgument(
                f"request parameter '{key}' must be true or false, got {describe(flag)}"
            )
    if isinstance(sequence_id, str):
        if len(sequence_id) > MAX_SEQUENCE_ID_CHARS:
            raise InvalidArgument(
                f"request parameter 'sequence_id' is {len(sequence_id)} characters long; "
                f"at most {MAX_SEQUENCE_ID_CHARS} are accepted"
            )
    elif type(sequence_id) is not int or not 0 <= sequence_id < 2**64:
        raise InvalidArgument(
            "request parameter 'sequence_id' must be an unsigned 64-bit integer or a "
            f"string, got {describe(sequence_id)}"
        )
    if not sequence_id:
        return None
    return SequenceFlags(sequence_id, flags[0] is True, flags[1] is True)


def _unsigned(value: object, key: str) -> int:
    if type(value) is not int or not 0 <= value < 2**64:
        raise InvalidArgument(
            f"request parameter '{key}' must be an integer >= 0, got {describe(value)}"
        )
    return value
