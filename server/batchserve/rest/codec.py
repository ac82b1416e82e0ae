"""KServe v2 JSON plus Triton's binary tensor extension, to and from the internal types.

With an ``Inference-Header-Content-Length`` of N, the body is N bytes of JSON followed
by the raw bytes of every input carrying ``binary_data_size``, in input order; those
inputs become zero-copy views of the body. Responses use the same layout.

Elements that must be built one by one (JSON ``data``, binary BYTES) are decoded only after
the request has been checked against its model, when a schema is given (``deferred.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

import numpy as np
import orjson

from batchserve.core.datatypes import DataType, from_wire
from batchserve.core.deferred import Decoder, PendingInputs, check_then_decode, view_or_later
from batchserve.core.digits import ascii_digits
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import (
    Array,
    array_from_bytes,
    array_to_bytes,
    check_count,
    check_output_parameters,
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
from batchserve.core.validation import SchemaLookup
from batchserve.dataplane.shared_memory.parameters import placeholder, placement
from batchserve.rest import json_text
from batchserve.rest.json_tensors import (
    JSON_OPTIONS,
    NotJsonRepresentable,
    array_from_json,
    array_to_json,
)

Chunk = bytes | memoryview
Json = dict[str, Any]

MAX_HEADER_LENGTH: Final = 2**31
HEADER: Final = "Inference-Header-Content-Length"


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The Inference-Header-Content-Length value, or None when the header is absent."""
    if value is None:
        return None
    text = value.strip()
    if not ascii_digits(text):
        raise InvalidArgument(
            f"Unable to parse {HEADER}, got: {value[:40]} (batchserve: not a non-negative integer)"
        )
    length = int(text) if len(text) <= 12 else MAX_HEADER_LENGTH + 1
    if length > MAX_HEADER_LENGTH:
        raise InvalidArgument(
            f"Unable to parse {HEADER}, value is out of range [ -2147483648, 2147483647 ], "
            f"got: {text[:40]} (batchserve: at most {MAX_HEADER_LENGTH})"
        )
    if length > body_length:
        raise InvalidArgument(
            f"inference header size should be in range (0, {body_length}), got: {length} "
            f"(batchserve: {HEADER} is larger than the body)"
        )
    return length


def decode_infer_request(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str,
    schema: SchemaLookup | None = None,
) -> InferRequest:
    """One infer body as an InferRequest; every problem is an InvalidArgument naming its field.
    With ``schema``, a request its model refuses is refused before any element is decoded."""
    json_end = _json_end(body, header_length)
    doc = _load(body, json_end, has_header=header_length is not None)
    options = request_options(_parameters(doc, "request"), http=True)
    outputs = _decode_outputs(doc["outputs"]) if "outputs" in doc else None
    reader = _BinaryReader(body, json_end, has_header=header_length is not None)
    pending = PendingInputs()
    inputs = _decode_inputs(doc.get("inputs"), reader, pending)
    reader.finish()
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=_request_id(doc),
        inputs=inputs,
        outputs=outputs,
        parameters=options.parameters,
        priority=options.priority,
        timeout_us=options.timeout_us,
        binary_output=options.binary_output,
        protocol="http",
        sequence=options.sequence,
    )
    return check_then_decode(request, pending, schema)


def _json_end(body: bytes, header_length: int | None) -> int:
    if header_length is None:
        return len(body)
    if header_length == 0 and body:
        raise InvalidArgument(
            f"{HEADER} is 0: a raw binary request has no JSON header; it is decoded from the "
            "model's configuration"
        )
    if not 0 <= header_length <= len(body):
        raise InvalidArgument(f"{HEADER} {header_length} does not fit the {len(body)}-byte body")
    return header_length


def _load(body: bytes, json_end: int, *, has_header: bool) -> Json:
    try:
        doc = json_text.loads(memoryview(body)[:json_end])
    except json_text.MalformedJson as error:
        hint = ""
        if not has_header and b'"binary_data_size"' in body:
            hint = f" (binary tensor data needs the {HEADER} header)"
        raise InvalidArgument(f"malformed JSON: {error}{hint}") from None
    if type(doc) is not dict:
        raise InvalidArgument(f"the request must be a JSON object, got {describe(doc)}")
    return doc


# Messages name their place (``inputs[2]``, ``tensor 'x'``) only once something is wrong:
# building the label up front would cost the valid requests.


def _parameters(obj: Json, kind: str, name: str = "") -> Json:
    if "parameters" not in obj:
        return {}
    value = obj["parameters"]
    if type(value) is not dict:
        where = f"{kind} '{name}'" if name else kind
        raise InvalidArgument(f"{where}: 'parameters' must be an object, got {describe(value)}")
    return value


def _object(value: object, array: str, index: int) -> Json:
    if type(value) is not dict:
        raise InvalidArgument(f"{array}[{index}] must be an object, got {describe(value)}")
    return value


def _name(obj: Json, array: str, index: int) -> str:
    name = obj.get("name")
    if type(name) is not str or not name:
        raise InvalidArgument(
            f"{array}[{index}]: 'name' must be a non-empty string, got {describe(name)}"
        )
    return name


def _request_id(doc: Json) -> str:
    value = doc.get("id", "")
    if type(value) is not str:
        raise InvalidArgument(f"request 'id' must be a string, got {describe(value)}")
    return value


def _decode_outputs(value: object) -> list[RequestedOutput] | None:
    """Requested outputs; an empty list, like none, means every output."""
    if type(value) is not list:
        raise InvalidArgument(f"'outputs' must be an array, got {describe(value)}")
    check_count(len(value), what="output")
    outputs = [_decode_output(item, index) for index, item in enumerate(value)]
    check_unique([output.name for output in outputs], what="output")
    return outputs or None


def _decode_output(item: object, index: int) -> RequestedOutput:
    obj = _object(item, "outputs", index)
    name = _name(obj, "outputs", index)
    parameters = _parameters(obj, "output", name)
    check_output_parameters(parameters, tensor=name)
    placement(parameters, name)
    binary = parameters.get("binary_data")
    if binary is not None and type(binary) is not bool:
        raise InvalidArgument(
            f"output '{name}': parameter 'binary_data' must be true or false, "
            f"got {describe(binary)}"
        )
    classes = (
        class_count(parameters["classification"], tensor=name)
        if "classification" in parameters
        else 0
    )
    return RequestedOutput(name, binary, classes, parameters)


def _decode_inputs(value: object, reader: _BinaryReader, pending: PendingInputs) -> list[Tensor]:
    if type(value) is not list:  # empty is for validation to judge: inputs may be optional
        raise InvalidArgument(f"'inputs' must be an array, got {describe(value)}")
    check_count(len(value), what="input")
    inputs = [_decode_input(item, index, reader, pending) for index, item in enumerate(value)]
    check_unique([tensor.name for tensor in inputs], what="input")
    return inputs


def _decode_input(
    item: object, index: int, reader: _BinaryReader, pending: PendingInputs
) -> Tensor:
    obj = _object(item, "inputs", index)
    name = _name(obj, "inputs", index)
    wire = obj.get("datatype")
    if type(wire) is not str:
        raise InvalidArgument(f"tensor '{name}': 'datatype' must be a string, got {describe(wire)}")
    datatype = from_wire(wire, tensor=name)
    if "shape" not in obj:
        raise InvalidArgument(f"tensor '{name}': 'shape' is missing")
    shape = _json_shape(obj["shape"], name, datatype)
    parameters = _parameters(obj, "tensor", name)
    data = _input_data(obj, parameters, (name, datatype, shape), reader)
    if isinstance(data, np.ndarray):
        return Tensor(name, datatype, shape, data, parameters)
    return pending.tensor(name, datatype, shape, parameters, data)


def _json_shape(shape: object, name: str, datatype: DataType) -> tuple[int, ...]:
    """The input's shape; one that is not an array of unsigned integers is refused in the
    words of Triton's HTTP front end, which reads it as one."""
    try:
        return checked_shape(shape, tensor=name, datatype=datatype)
    except InvalidArgument:
        if type(shape) is not list:
            reading, ours = "non-array as array", f"shape is {describe(shape)}, not an array"
        else:
            odd = [d for d in shape if type(d) is not int or d < 0]
            if not odd:
                raise  # unsigned integers, refused for their values
            reading = "non-unsigned-integer as unsigned-integer"
            ours = f"shape dimension {describe(odd[0])} is not an unsigned integer"
    raise InvalidArgument(
        f"Unable to parse 'shape': attempt to access JSON {reading} (batchserve: tensor "
        f"'{name}': {ours})"
    )


def _input_data(
    obj: Json, parameters: Json, spec: tuple[str, DataType, tuple[int, ...]], reader: _BinaryReader
) -> Array | Decoder:
    """The input's elements from ``data`` or, with binary_data_size, from the binary section:
    a view when that costs nothing, else how to decode them once the request is valid."""
    name, datatype, shape = spec
    if parameters:
        has_data = "data" in obj or "binary_data_size" in parameters
        shared = placeholder(parameters, has_data, datatype, shape, name)
        if shared is not None:
            return shared
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in obj:
            raise InvalidArgument(f"tensor '{name}': needs 'data' or a binary_data_size parameter")
        return partial(array_from_json, obj["data"], datatype, shape, tensor=name)
    if "data" in obj:
        raise InvalidArgument(
            f"tensor '{name}': has both 'data' and binary_data_size; send one of them"
        )
    if type(size) is not int or size < 0:
        raise InvalidArgument(
            f"tensor '{name}': binary_data_size must be an integer >= 0, got {describe(size)}"
        )
    data = reader.take(size, name)
    if datatype.wire == "BYTES":  # elements built one by one
        return partial(array_from_bytes, data, datatype, shape, tensor=name)
    return view_or_later(data, datatype, shape, tensor=name)  # a view, its size checked


class _BinaryReader:
    """Hands out consecutive zero-copy slices of the body after the JSON header."""

    __slots__ = ("_body", "_has_header", "_offset")

    def __init__(self, body: bytes, start: int, *, has_header: bool) -> None:
        self._body = memoryview(body)
        self._offset = start
        self._has_header = has_header

    def take(self, size: int, tensor: str) -> memoryview:
        if not self._has_header:
            raise InvalidArgument(
                f"tensor '{tensor}': binary_data_size is set but the request has no {HEADER} header"
            )
        end = self._offset + size
        if end > self._body.nbytes:
            raise InvalidArgument(
                f"tensor '{tensor}': binary_data_size {size} runs past the end of the body "
                f"({self._body.nbytes - self._offset} bytes remain)"
            )
        view = self._body[self._offset : end]
        self._offset = end
        return view

    def finish(self) -> None:
        left = self._body.nbytes - self._offset
        if left:
            raise InvalidArgument(
                f"{left} bytes of binary data are left over after the last binary input"
            )


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[list[Chunk], int | None]:
    """Body chunks (the JSON header, then binary outputs) and the header's length,
    None when the whole body is JSON (no Inference-Header-Content-Length then), as it is
    when every binary output is empty."""
    wanted = {output.name: output.binary for output in request.outputs or ()}
    chunks: list[Chunk] = [b""]
    # As Triton: binary_data_output is the default only when no output is listed; a listed
    # output without binary_data is JSON.
    default = request.binary_output and not wanted
    outputs = [
        _encode_output(tensor, _or(wanted.get(tensor.name), default), chunks)
        for tensor in response.outputs
    ]
    doc: Json = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    chunks[0] = orjson.dumps(doc, option=JSON_OPTIONS)
    return chunks, (len(chunks[0]) if len(chunks) > 1 else None)


def _or(flag: bool | None, default: bool) -> bool:
    return default if flag is None else flag


def _encode_output(tensor: Tensor, binary: bool, chunks: list[Chunk]) -> Json:
    """The output's JSON entry; a binary output's bytes are appended to ``chunks``."""
    out: Json = {"name": tensor.name, "datatype": tensor.datatype.wire, "shape": tensor.shape}
    parameters = dict(tensor.parameters)
    if tensor.in_shared_memory:  # as Triton: metadata only, the data is in the region
        if parameters:
            out["parameters"] = parameters
        return out
    if not binary:
        try:
            out["data"] = array_to_json(tensor.data, tensor.datatype, tensor=tensor.name)
        except NotJsonRepresentable:
            binary = True  # JSON strings cannot carry it; clients read either form
    if binary:
        raw = array_to_bytes(tensor.data, tensor.datatype, tensor=tensor.name)
        if len(raw):  # as Triton: no bytes, no buffer (a body of none is plain JSON)
            chunks.append(raw)
        parameters["binary_data_size"] = len(raw)
    if parameters:
        out["parameters"] = parameters
    return out


def encode_error(message: str) -> bytes:
    """The protocol's error body."""
    return orjson.dumps({"error": message})
