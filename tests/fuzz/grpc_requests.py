"""ModelInferRequest messages for fuzzing: valid ones (typed contents or raw contents), then
structural mutations within what protobuf can carry; ``wire_bytes`` also damages a valid
message's serialized form, which is what arrives on the socket."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from batchserve.core.datatypes import BY_WIRE
from batchserve.grpc.codec import CONTENTS_FIELD
from batchserve.proto.grpc_service_pb2 import InferParameter, ModelInferRequest
from hypothesis import strategies as st

from tests.fuzz.properties import OUTPUT_NAMES
from tests.fuzz.values import (
    HUGE_DIMS,
    MAX_FILLED,
    NAMES,
    ODD_WIRES,
    SPECS,
    TRICKY_SHAPES,
    WIRES,
    raw_contents,
    values,
    zero_bytes,
    zeros,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
# The range each contents field can hold on the wire.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": INT64,
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}
PARAMETERS = st.one_of(
    st.booleans().map(lambda v: InferParameter(bool_param=v)),
    INT64.map(lambda v: InferParameter(int64_param=v)),
    st.integers(0, 2**64 - 1).map(lambda v: InferParameter(uint64_param=v)),
    st.floats().map(lambda v: InferParameter(double_param=v)),
    st.text(max_size=4).map(lambda v: InferParameter(string_param=v)),
    st.just(InferParameter()),  # no value of the oneof set
)
PARAMETER_KEYS = st.sampled_from(
    [
        "priority",
        "timeout",
        "binary_data_output",
        "sequence_id",
        "shared_memory_region",
        "shared_memory_byte_size",
        "shared_memory_offset",
        "classification",
        "binary_data_size",
        "other",
    ]
)


def _fits(values: list[Any], field: str) -> list[Any]:
    """The values clipped into what the contents field's wire type holds."""
    strategy_bounds = {
        "int_contents": (-(2**31), 2**31 - 1),
        "int64_contents": (-(2**63), 2**63 - 1),
        "uint_contents": (0, 2**32 - 1),
        "uint64_contents": (0, 2**64 - 1),
    }
    if field not in strategy_bounds:
        return values
    low, high = strategy_bounds[field]
    return [min(max(v, low), high) for v in values]


@st.composite
def valid_messages(draw: st.DrawFn) -> ModelInferRequest:
    """A well-formed request (values may still be out of range for their datatype)."""
    message = ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        spec = draw(SPECS)
        tensor = message.inputs.add(name=spec.name, datatype=spec.wire, shape=spec.shape)
        count = 1
        for dim in spec.shape:
            count *= dim
        field = CONTENTS_FIELD.get(spec.wire)
        if raw or field is None:
            message.raw_input_contents.append(raw_contents(draw, spec.wire, count))
            continue
        items = draw(values(spec.wire, count, text=False))
        getattr(tensor.contents, field).extend(_fits(items, field))
    if raw is False and len(message.raw_input_contents) not in (0, len(message.inputs)):
        message.ClearField("raw_input_contents")  # a typeless datatype forced raw: all raw
        for tensor in message.inputs:
            tensor.ClearField("contents")
            count = 1
            for dim in tensor.shape:
                count *= dim
            message.raw_input_contents.append(raw_contents(draw, tensor.datatype, count))
    for name in draw(st.lists(st.sampled_from(OUTPUT_NAMES), max_size=2, unique=True)):
        message.outputs.add(name=name)
    return message


Mutation = Callable[[st.DrawFn, ModelInferRequest], None]


def _tensor(draw: st.DrawFn, message: ModelInferRequest) -> ModelInferRequest.InferInputTensor:
    return message.inputs[draw(st.integers(0, len(message.inputs) - 1))]


_SHAPES = st.lists(st.sampled_from([*HUGE_DIMS, -1, -(2**63), 0]) | INT64, max_size=4) | st.just(
    [1] * 65
)


def shape(draw: st.DrawFn, message: ModelInferRequest) -> None:
    tensor = _tensor(draw, message)
    tensor.ClearField("shape")
    tensor.shape.extend(draw(_SHAPES))


def tricky_shape(draw: st.DrawFn, message: ModelInferRequest) -> None:
    """A shape from TRICKY_SHAPES, with contents (or raw contents) to match when small."""
    index = draw(st.integers(0, len(message.inputs) - 1))
    tensor = message.inputs[index]
    shape = draw(TRICKY_SHAPES)
    tensor.ClearField("shape")
    tensor.shape.extend(shape)
    count, wire = math.prod(shape), tensor.datatype
    if count > MAX_FILLED or wire not in BY_WIRE:
        return
    if len(message.raw_input_contents) == len(message.inputs):
        message.raw_input_contents[index] = zero_bytes(wire, count)
    elif wire in CONTENTS_FIELD:
        tensor.ClearField("contents")
        getattr(tensor.contents, CONTENTS_FIELD[wire]).extend(zeros(wire, count, text=False))


def datatype(draw: st.DrawFn, message: ModelInferRequest) -> None:
    _tensor(draw, message).datatype = draw(_DATATYPES)


_DATATYPES = st.sampled_from(ODD_WIRES + WIRES)
_FIELDS = st.sampled_from(sorted(FIELD_VALUES))
_CONTENTS = {field: st.lists(values, max_size=6) for field, values in FIELD_VALUES.items()}


def contents(draw: st.DrawFn, message: ModelInferRequest) -> None:
    """Values in some contents field: the wrong one, a wrong count, or out of range."""
    tensor = _tensor(draw, message)
    field = draw(_FIELDS)
    items = draw(_CONTENTS[field])
    if draw(st.booleans()):
        tensor.ClearField("contents")
    getattr(tensor.contents, field).extend(items)


def raw_entries(draw: st.DrawFn, message: ModelInferRequest) -> None:
    raw = message.raw_input_contents
    choice = draw(st.sampled_from(["add", "drop", "resize", "clear"]))
    if choice == "add" or not raw:
        raw.append(draw(st.binary(max_size=16)))
    elif choice == "drop":
        del raw[draw(st.integers(0, len(raw) - 1))]
    elif choice == "resize":
        index = draw(st.integers(0, len(raw) - 1))
        raw[index] = raw[index][: draw(st.integers(0, 16))] + draw(st.binary(max_size=4))
    else:
        message.ClearField("raw_input_contents")


def names(draw: st.DrawFn, message: ModelInferRequest) -> None:
    others = [tensor.name for tensor in message.inputs]
    _tensor(draw, message).name = draw(st.sampled_from([*others, ""]) | NAMES)


def tensor_parameters(draw: st.DrawFn, message: ModelInferRequest) -> None:
    params = draw(st.dictionaries(PARAMETER_KEYS, PARAMETERS, max_size=2))
    if message.outputs and draw(st.booleans()):
        target = message.outputs[draw(st.integers(0, len(message.outputs) - 1))].parameters
    else:
        target = _tensor(draw, message).parameters
    for key, value in params.items():
        target[key].CopyFrom(value)


def request_parameters(draw: st.DrawFn, message: ModelInferRequest) -> None:
    for key, value in draw(st.dictionaries(PARAMETER_KEYS, PARAMETERS, max_size=3)).items():
        message.parameters[key].CopyFrom(value)


def counts(draw: st.DrawFn, message: ModelInferRequest) -> None:
    """No inputs, a duplicate, past the tensor limit; outputs likewise."""
    choice = draw(st.sampled_from(["no inputs", "dup input", "many inputs", "dup out", "many out"]))
    first = ModelInferRequest.InferInputTensor()
    first.CopyFrom(message.inputs[0])
    if choice == "no inputs":
        message.ClearField("inputs")
    elif choice == "dup input":
        message.inputs.append(first)
    elif choice == "many inputs":
        message.inputs.extend([first] * 1024)
    else:
        for _ in range(2 if choice == "dup out" else 1025):
            message.outputs.add(name="y")


MUTATIONS: list[Mutation] = [
    shape,
    tricky_shape,
    tricky_shape,
    datatype,
    contents,
    raw_entries,
    names,
    tensor_parameters,
    request_parameters,
    counts,
]


_MUTATION = st.sampled_from(MUTATIONS)


@st.composite
def messages(draw: st.DrawFn) -> ModelInferRequest:
    """A valid message with up to three structural mutations."""
    message = draw(valid_messages())
    for _ in range(draw(st.integers(0, 3))):
        if not message.inputs:
            break  # refused as it is; every mutation works on an input
        draw(_MUTATION)(draw, message)
    return message


@st.composite
def wire_bytes(draw: st.DrawFn) -> bytes:
    """A (possibly mutated) message's serialized form, then damaged byte by byte."""
    data = bytearray(draw(messages()).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "set", "delete", "insert", "duplicate"]))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and at < len(data):
            data[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
    return bytes(data)
