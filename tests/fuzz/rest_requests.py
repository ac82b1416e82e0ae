"""REST infer bodies for fuzzing: valid KServe v2 JSON (with Triton's binary extension),
then a few structural mutations, so that most inputs get past the JSON parser and reach
the decoder's own checks. ``mutated_bodies`` also damages valid bodies byte by byte.

JSON that ``orjson.dumps`` cannot write (lone surrogates, 2**64, 1e400, invalid UTF-8,
deep nesting) goes in as raw tokens spliced into the serialized text.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from batchserve.core.datatypes import BY_WIRE
from hypothesis import strategies as st

from tests.fuzz.properties import OUTPUT_NAMES
from tests.fuzz.values import (
    HUGE_DIMS,
    MAX_FILLED,
    NAMES,
    ODD_DIMS,
    ODD_WIRES,
    SPECS,
    TRICKY_SHAPES,
    WIRES,
    nested,
    raw_contents,
    values,
    zero_bytes,
    zeros,
)

RAW_TOKENS = [
    rb'"\ud800"',
    rb'"a\udc00b"',
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"-0",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"18446744073709551615",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1E+2",
    rb'"\u0000"',
    b'"\xff\xfe"',
    b'"\xed\xa0\x80"',
    b"01",
    b".5",
    b"0x10",
    b'{"a": 1, "a": 2}',
    b"[" * 40 + b"]" * 40,
    b"[" * 3000 + b"]" * 3000,
    b"[1,]",
    b"",
]
_RAW = re.compile(rb'"\\u0000raw(\d+)"')


def raw(index: int) -> str:
    """A placeholder that ``render`` replaces by ``RAW_TOKENS[index]``."""
    return f"\x00raw{index}"


RAWS = st.integers(0, len(RAW_TOKENS) - 1).map(raw)


def jsonable(value: Any) -> Any:
    """``value``, or the raw token of an integer past the 64 bits orjson writes."""
    if type(value) is int and not -(2**63) <= value < 2**64:
        return raw(RAW_TOKENS.index(str(value).encode()))
    return value


def fresh(values: list[Any]) -> st.SearchStrategy[Any]:
    """One of ``values``, copied: later mutations must not change the strategy's own lists."""
    return st.sampled_from(values).map(copy.deepcopy)


ODD_VALUES = (
    st.sampled_from([None, True, False, 0, -1, 1.5, -0.0, 2**63 - 1, -(2**63), 2**64 - 1])
    | fresh(["", "1", "x" * 100, [], [[]], {}, {"a": 1}, [1, [2]], [None]])
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | RAWS
)


@dataclass
class RestCase:
    """A request being built: its JSON document, binary chunks (one per binary input, in
    order) and the Inference-Header-Content-Length to send: None for none, an int for the
    JSON's length plus that much, a string to send as it is."""

    doc: Any
    chunks: list[bytes] = field(default_factory=list)
    header: int | str | None = None

    def inputs(self) -> list[Any]:
        doc = self.doc
        if type(doc) is dict and type(doc.get("inputs")) is list:
            return [t for t in doc["inputs"] if type(t) is dict]
        return []


def render(case: RestCase) -> tuple[bytes, str | None]:
    """The body bytes and header value a client would send."""
    text = _RAW.sub(lambda m: RAW_TOKENS[int(m[1])], orjson.dumps(case.doc))
    body = text + b"".join(case.chunks)
    if case.header is None or isinstance(case.header, str):
        return body, case.header
    return body, str(max(0, len(text) + case.header))


@st.composite
def _tensor(draw: st.DrawFn, case: RestCase) -> dict[str, Any]:
    spec = draw(SPECS)
    tensor: dict[str, Any] = {"name": spec.name, "datatype": spec.wire, "shape": list(spec.shape)}
    count = 1
    for dim in spec.shape:
        count *= dim
    if draw(st.booleans()):  # binary
        chunk = raw_contents(draw, spec.wire, count)
        tensor["parameters"] = {"binary_data_size": len(chunk)}
        case.chunks.append(chunk)
        case.header = 0
    else:
        flat = [jsonable(value) for value in draw(values(spec.wire, count, text=True))]
        tensor["data"] = nested(flat, spec.shape) if draw(st.booleans()) else flat
    return tensor


@st.composite
def valid_cases(draw: st.DrawFn) -> RestCase:
    """A well-formed request (its values may still be out of range for their type)."""
    case = RestCase({})
    case.doc["inputs"] = [draw(_tensor(case)) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        names = st.sampled_from(OUTPUT_NAMES)
        outputs = draw(st.lists(names, max_size=2, unique=True))
        case.doc["outputs"] = [{"name": name} for name in outputs]
    if draw(st.booleans()):
        case.doc["id"] = draw(st.text(max_size=8))
    if draw(st.booleans()):
        case.doc["parameters"] = {"priority": draw(st.integers(0, 3))}
    return case


# --- mutations: each changes one thing, on a tensor or on the document ----------------------

Mutation = Callable[[st.DrawFn, RestCase], None]


def _pick(draw: st.DrawFn, items: list[Any]) -> Any:
    return items[draw(st.integers(0, len(items) - 1))] if items else None


def shape_dim(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is not None and type(tensor.get("shape")) is list and tensor["shape"]:
        shape = tensor["shape"]
        shape[draw(st.integers(0, len(shape) - 1))] = draw(ODD_DIMS | RAWS)


_HUGE = st.lists(st.sampled_from(HUGE_DIMS), min_size=2, max_size=4)
_SHAPES = (
    fresh([None, "1,2", {}, 5, [], [1] * 65, [0, 2**31], [[2]], [2**64 - 1]])
    | _HUGE
    | _HUGE.map(lambda dims: [0, *dims])
    | st.lists(st.integers(0, 6), max_size=4)
)


def shape_whole(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is not None:
        tensor["shape"] = draw(_SHAPES)


def tricky_shape(draw: st.DrawFn, case: RestCase) -> None:
    """A shape from TRICKY_SHAPES, with data (or binary data) to match when it is small."""
    inputs = case.inputs()
    tensor = _pick(draw, inputs)
    if tensor is None:
        return
    shape = tensor["shape"] = draw(TRICKY_SHAPES)
    count, wire = math.prod(shape), tensor.get("datatype")
    if count > MAX_FILLED or type(wire) is not str or wire not in BY_WIRE:
        return
    if "data" in tensor:
        tensor["data"] = zeros(wire, count, text=True)
        return
    binary = [t for t in inputs if type(t.get("parameters")) is dict and t["parameters"]]
    index = next((i for i, t in enumerate(binary) if t is tensor), len(case.chunks))
    if index < len(case.chunks) and "binary_data_size" in tensor["parameters"]:
        case.chunks[index] = zero_bytes(wire, count)
        tensor["parameters"]["binary_data_size"] = len(case.chunks[index])


def datatype(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is not None:
        tensor["datatype"] = draw(_DATATYPES)


_DATATYPES = st.sampled_from(ODD_WIRES + WIRES) | ODD_VALUES


def _data_lists(value: Any, found: list[list[Any]]) -> None:
    if type(value) is list:
        found.append(value)
        for item in value:
            _data_lists(item, found)


def data_element(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    lists: list[list[Any]] = []
    _data_lists(tensor.get("data") if tensor else None, lists)
    target = _pick(draw, [lst for lst in lists if lst])
    if target is not None:
        target[draw(st.integers(0, len(target) - 1))] = draw(ODD_VALUES)


def data_count(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    lists: list[list[Any]] = []
    _data_lists(tensor.get("data") if tensor else None, lists)
    target = _pick(draw, lists)
    if target is not None:
        if target and draw(st.booleans()):
            target.pop()
        else:
            target.append(target[0] if target else draw(ODD_VALUES))


_DATA = fresh([None, "abc", 5, {}, [], [[]], [[], []], [[1], 2], [1, [2]]]) | ODD_VALUES


def data_whole(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is not None:
        old, nesting = tensor.get("data"), draw(st.integers(0, 2))
        tensor["data"] = [old] if nesting == 1 else [[old]] if nesting == 2 else draw(_DATA)


def parameters(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is None:
        return
    params = tensor.get("parameters")
    size = params.get("binary_data_size") if type(params) is dict else None
    choice = draw(st.integers(0, 4))
    if choice == 0 and type(size) is int:  # off by a little
        tensor["parameters"] = {"binary_data_size": size + draw(st.sampled_from([-1, 1, size]))}
    elif choice <= 1:
        tensor["parameters"] = {"binary_data_size": draw(_SIZES)}
    elif choice == 2:
        tensor["parameters"] = draw(fresh([[], "p", 1, None]))
    elif choice == 3:
        extra = draw(st.sampled_from(["shared_memory_region", "classification", "binary_data"]))
        tensor["parameters"] = {extra: 1, **(params if type(params) is dict else {})}
    else:  # in a shared-memory region: the bytes are elsewhere
        tensor["parameters"] = {
            "shared_memory_region": draw(st.sampled_from(["r", "", 1])),
            "shared_memory_byte_size": draw(_SIZES),
        }
        tensor.pop("data", None)
    if draw(st.booleans()):
        tensor["data"] = [1]  # data and binary_data_size together, or data moved


_SIZES = st.sampled_from([-1, 0, 2**31, 2**63 - 1, 1.0, True, "8", None])


def name(draw: st.DrawFn, case: RestCase) -> None:
    inputs = case.inputs()
    tensor = _pick(draw, inputs)
    if tensor is not None:
        if draw(st.booleans()):
            tensor["name"] = _pick(draw, inputs).get("name")  # a duplicate, or no name
        else:
            tensor["name"] = draw(NAMES | fresh([None, 1, [], ""]))


def drop_key(draw: st.DrawFn, case: RestCase) -> None:
    tensor = _pick(draw, case.inputs())
    if tensor is not None and tensor:
        del tensor[draw(st.sampled_from(sorted(tensor)))]


def inputs_list(draw: st.DrawFn, case: RestCase) -> None:
    if type(case.doc) is not dict:
        return
    inputs = case.doc.get("inputs")
    first = inputs[0] if type(inputs) is list and inputs else {}
    choice = draw(st.integers(0, 2))
    if choice == 0:
        case.doc["inputs"] = [first, first]
    elif choice == 1:
        case.doc["inputs"] = [first] * 1025
    else:
        case.doc["inputs"] = draw(fresh([None, {}, [], "x", [None], [1, 2]]))


_OUTPUT = st.fixed_dictionaries(
    {"name": st.sampled_from(OUTPUT_NAMES) | ODD_VALUES},
    optional={
        "parameters": fresh(
            [
                {"binary_data": True},
                {"binary_data": "yes"},
                {"binary_data": None},
                {"classification": 2},
                {"classification": 0},
                {"classification": -1},
                {"classification": jsonable(2**64)},
                {"classification": "2"},
                {"classification": True},
                [],
                "p",
            ]
        )
    },
)
_OUTPUTS = st.lists(_OUTPUT | ODD_VALUES, max_size=3) | fresh(
    [None, {}, "y", [{"name": "y"}] * 2, [{"name": "y"}] * 1025]
)


def outputs_list(draw: st.DrawFn, case: RestCase) -> None:
    if type(case.doc) is dict:
        case.doc["outputs"] = draw(_OUTPUTS)


_PARAMETERS = st.dictionaries(
    st.sampled_from(
        ["priority", "timeout", "binary_data_output", "sequence_id", "sequence_start", "other"]
    ),
    ODD_VALUES,
    max_size=3,
) | fresh([None, [], "p", 1])


def request_parameters(draw: st.DrawFn, case: RestCase) -> None:
    if type(case.doc) is dict:
        case.doc["parameters"] = draw(_PARAMETERS)


def request_id(draw: st.DrawFn, case: RestCase) -> None:
    if type(case.doc) is dict:
        case.doc["id"] = draw(ODD_VALUES)


def document(draw: st.DrawFn, case: RestCase) -> None:
    case.doc = [case.doc] if draw(st.booleans()) else draw(fresh([[], "x", 1, None]) | RAWS)


_CHUNK_CHANGES = st.sampled_from(["drop", "truncate", "extend", "add"])


def binary_section(draw: st.DrawFn, case: RestCase) -> None:
    chunks = case.chunks
    choice = draw(_CHUNK_CHANGES)
    if choice == "add" or not chunks:
        chunks.append(draw(st.binary(max_size=16)))
    elif choice == "drop":
        chunks.pop(draw(st.integers(0, len(chunks) - 1)))
    else:
        index = draw(st.integers(0, len(chunks) - 1))
        chunk = chunks[index]
        chunks[index] = chunk[:-1] if choice == "truncate" else chunk + draw(st.binary(max_size=8))


_HEADERS = (
    st.none()
    | st.integers(-8, 8)
    | st.sampled_from(["0", "", " 12 ", "-1", "1e3", "٣", "99999999999999", "2147483649"])
    | st.text(max_size=6)
)


def header(draw: st.DrawFn, case: RestCase) -> None:
    case.header = draw(_HEADERS)


MUTATIONS: list[Mutation] = [
    shape_dim,
    shape_whole,
    tricky_shape,
    tricky_shape,
    datatype,
    data_element,
    data_count,
    data_whole,
    parameters,
    name,
    drop_key,
    inputs_list,
    outputs_list,
    request_parameters,
    request_id,
    document,
    binary_section,
    header,
]


_MUTATION = st.sampled_from(MUTATIONS)


@st.composite
def documents(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A valid request with up to three structural mutations, as (body, header value)."""
    case = draw(valid_cases())
    for _ in range(draw(st.integers(0, 3))):
        draw(_MUTATION)(draw, case)
    return render(case)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A valid body damaged byte by byte: flips, cuts, insertions, duplicated ranges."""
    body, header_value = render(draw(valid_cases()))
    data = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "delete", "insert", "duplicate", "truncate"]))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8) | st.sampled_from(RAW_TOKENS))
        elif kind == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
        else:
            del data[at:]
    return bytes(data), header_value
