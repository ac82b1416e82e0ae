"""ModelInferRequest / ModelInferResponse messages to and from the internal types.

Inputs arrive either as typed ``contents`` or as ``raw_input_contents`` (one entry per
input, what tritonclient and perf_analyzer send); outputs always leave as
``raw_output_contents``, which is what those clients read.

Typed contents and raw BYTES, whose elements are built one by one, are decoded only after
the request has been checked against its model, when a schema is given (``deferred.py``).
Typed contents arrive unparsed (``head.py``): their fields and element count are checked
when they are parsed, in that second step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final

import numpy as np

from batchserve.core.datatypes import DataType, from_wire
from batchserve.core.deferred import Decoder, PendingInputs, check_then_decode, view_or_later
from batchserve.core.errors import Internal, InvalidArgument
from batchserve.core.tensors import (
    Array,
    array_from_bytes,
    array_from_values,
    array_to_bytes,
    check_count,
    check_output_parameters,
    check_unique,
    checked_shape,
    class_count,
    format_shape,
)
from batchserve.core.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    request_options,
)
from batchserve.core.validation import SchemaLookup
from batchserve.dataplane.shared_memory.parameters import REGION, placeholder, placement
from batchserve.grpc.head import (
    Head,
    InputHead,
    Request,
    contents_of,
    head_of,
    raw_contents_of,
)
from batchserve.proto.grpc_service_pb2 import InferParameter, ModelInferRequest, ModelInferResponse

OutputTensor = ModelInferResponse.InferOutputTensor

# The typed field holding each datatype; FP16 and BF16 travel only as raw contents.
CONTENTS_FIELD: Final = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_INT64: Final = range(-(2**63), 2**63)


def decode_infer_request(
    message: Request,
    schema: SchemaLookup | None = None,
    raw_contents: Sequence[bytes | memoryview] | None = None,
) -> InferRequest:
    """A ModelInferRequest as an InferRequest; problems are InvalidArgument naming the field.
    With ``schema``, a request its model refuses is refused before any element is decoded.
    ``raw_contents`` stands for the message's raw_input_contents when the caller already
    read them (reading a protobuf message's copies every entry); by default, the
    message's own (``head.raw_contents_of``)."""
    if raw_contents is None:
        raw_contents = raw_contents_of(message)
    message = head_of(message)
    options = request_options(parameter_values(message.parameters))
    outputs = _decode_outputs(message.outputs)
    pending = PendingInputs()
    request = InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=_decode_inputs(message, pending, raw_contents),
        outputs=outputs,
        parameters=options.parameters,
        priority=options.priority,
        timeout_us=options.timeout_us,
        protocol="grpc",
        sequence=options.sequence,
        empty_final=options.empty_final,
    )
    return check_then_decode(request, pending, schema)


def parameter_values(parameters: Mapping[str, InferParameter]) -> dict[str, Any]:
    """InferParameter map to plain values (None where no value of the oneof is set)."""
    values: dict[str, Any] = {}
    if not parameters:
        return values
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(parameter, choice)
    return values


def _decode_outputs(
    outputs: Sequence[ModelInferRequest.InferRequestedOutputTensor],
) -> list[RequestedOutput] | None:
    """Requested outputs; none means every output."""
    check_count(len(outputs), what="output")
    requested = []
    for index, output in enumerate(outputs):
        if not output.name:
            raise InvalidArgument(f"outputs[{index}]: 'name' must be a non-empty string")
        check_output_parameters(output.parameters, tensor=output.name)
        parameters = parameter_values(output.parameters)
        placement(parameters, output.name)
        requested.append(
            RequestedOutput(output.name, classification=_class_count(output), parameters=parameters)
        )
    check_unique([output.name for output in requested], what="output")
    return requested or None


def _class_count(output: ModelInferRequest.InferRequestedOutputTensor) -> int:
    """The output's ``classification`` parameter, which Triton reads as int64_param only."""
    if "classification" not in output.parameters:
        return 0
    parameter = output.parameters["classification"]
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgument(
            "invalid value type for 'classification' parameter, expected int64_param: "
            f"output '{output.name}': send classification as int64_param"
        )
    return class_count(parameter.int64_param, tensor=output.name)


def _decode_inputs(
    message: Head, pending: PendingInputs, contents: Sequence[bytes | memoryview]
) -> list[Tensor]:
    count = len(message.inputs)  # none is for validation to judge: inputs may be optional
    check_count(count, what="input")
    raw_count = len(contents)
    if raw_count:
        mixed = next((t.name for t in message.inputs if t.HasField("contents")), None)
        if mixed is not None:
            raise InvalidArgument(
                f"contents field must not be specified when using raw_input_contents for "
                f"'{mixed}' for model '{message.model_name}' (batchserve: send every input's "
                "data in one of them)"
            )
    raw: list[bytes | memoryview | None] = [None] * count
    if raw_count == count:
        raw = list(contents)
    elif raw_count:
        # as Triton: inputs in shared memory take no raw_input_contents entry
        wanted = [i for i, t in enumerate(message.inputs) if REGION not in t.parameters]
        if raw_count != len(wanted):
            raise InvalidArgument(
                f"raw_input_contents has {raw_count} entries but the request has "
                f"{len(wanted)} inputs" + (" not in shared memory" if len(wanted) < count else "")
            )
        for index, data in zip(wanted, contents, strict=True):
            raw[index] = data
    pairs = zip(message.inputs, raw, strict=True)
    inputs = [
        _decode_input(tensor, index, data, pending) for index, (tensor, data) in enumerate(pairs)
    ]
    check_unique([tensor.name for tensor in inputs], what="input")
    return inputs


def _decode_input(
    tensor: InputHead, index: int, raw: bytes | memoryview | None, pending: PendingInputs
) -> Tensor:
    name = tensor.name
    if not name:
        raise InvalidArgument(f"inputs[{index}]: 'name' must be a non-empty string")
    datatype = from_wire(tensor.datatype, tensor=name)
    shape = checked_shape(tensor.shape[:], tensor=name, datatype=datatype)  # [:]: 2x list()
    parameters = parameter_values(tensor.parameters)
    shared = None
    if parameters:
        has_data = raw is not None or tensor.HasField("contents")
        shared = placeholder(parameters, has_data, datatype, shape, name)
    if shared is not None:
        data: Array | Decoder = shared
    elif raw is None:
        data = _from_contents(tensor, datatype, shape)
    elif datatype.wire == "BYTES":  # elements built one by one
        data = partial(array_from_bytes, raw, datatype, shape, tensor=name)
    else:
        data = view_or_later(raw, datatype, shape, tensor=name)  # a view, its size checked
    if isinstance(data, np.ndarray):
        return Tensor(name, datatype, shape, data, parameters)
    return pending.tensor(name, datatype, shape, parameters, data)


def _from_contents(
    tensor: InputHead, datatype: DataType, shape: tuple[int, ...]
) -> Array | Decoder:
    """How to convert the input's typed contents. The header tells only whether any were
    sent; which field holds them, and how many elements, is known once they are parsed."""
    name, field, count = tensor.name, CONTENTS_FIELD.get(datatype.wire), math.prod(shape)
    sent = tensor.HasField("contents")
    if field is None:
        if count or (sent and tensor.contents):
            raise InvalidArgument(
                f"tensor '{name}': {datatype.wire} data must be sent in raw_input_contents"
            )
        return array_from_values((), datatype, shape, tensor=name)
    if not sent and count:
        raise _count_error(name, 0, shape)
    return partial(_typed_values, tensor, field, datatype, shape)


def _typed_values(
    tensor: InputHead, field: str, datatype: DataType, shape: tuple[int, ...]
) -> Array:
    """The parsed contents as an array, once the field and the element count are right."""
    name, contents = tensor.name, contents_of(tensor)
    wrong = [d.name for d, _ in contents.ListFields() if d.name != field]
    if wrong:
        raise InvalidArgument(
            f"tensor '{name}': {datatype.wire} data belongs in contents.{field}, "
            f"got contents.{wrong[0]}"
        )
    values: Sequence[Any] = getattr(contents, field)
    if len(values) != math.prod(shape):
        raise _count_error(name, len(values), shape)
    return array_from_values(values, datatype, shape, tensor=name)


def _count_error(name: str, sent: int, shape: tuple[int, ...]) -> InvalidArgument:
    return InvalidArgument(
        f"tensor '{name}': contents has {sent} elements, shape {format_shape(shape)} "
        f"needs {math.prod(shape)}"
    )


def answer_bytes(response: InferResponse) -> int:
    """About the bytes the encoded answer holds: its outputs' (a BYTES element counted as the
    pointer numpy holds for it), none for an output written into shared memory."""
    return sum(t.data.nbytes for t in response.outputs if not t.in_shared_memory)


def encode_infer_response(response: InferResponse) -> ModelInferResponse:
    """The response with every output's bytes in raw_output_contents (BYTES length-prefixed)."""
    outputs = [
        OutputTensor(
            name=tensor.name,
            datatype=tensor.datatype.wire,
            shape=tensor.shape,
            parameters=_parameters(tensor.parameters) if tensor.parameters else None,
        )
        for tensor in response.outputs
    ]
    raw = [  # an output in shared memory has an empty entry, as Triton sends
        b""
        if tensor.in_shared_memory
        else bytes(array_to_bytes(tensor.data, tensor.datatype, tensor=tensor.name))
        for tensor in response.outputs
    ]
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        parameters=_parameters(response.parameters) if response.parameters else None,
        outputs=outputs,
        raw_output_contents=raw,
    )


def _parameters(values: Mapping[str, object]) -> dict[str, InferParameter]:
    return {key: _parameter(key, value) for key, value in values.items()}


def _parameter(key: str, value: object) -> InferParameter:
    if isinstance(value, bool):
        return InferParameter(bool_param=value)
    if isinstance(value, int) and value in _INT64:
        return InferParameter(int64_param=value)
    if isinstance(value, int) and 0 <= value < 2**64:
        return InferParameter(uint64_param=value)
    if isinstance(value, float):
        return InferParameter(double_param=value)
    if isinstance(value, str):
        return InferParameter(string_param=value)
    raise Internal(f"response parameter '{key}' of type {type(value).__name__} has no gRPC form")
