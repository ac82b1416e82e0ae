"""The fuzz targets: each decoder of untrusted input, with what may be fed to it and the
property it must keep (``properties``). ``make fuzz`` runs them at a high example count
(tests/fuzz/test_fuzz.py); the unit suite runs the same targets at a low one.
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import array_from_bytes, array_to_bytes, checked_shape
from batchserve.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from batchserve.grpc import codec as grpc_codec
from batchserve.proto.grpc_service_pb2 import ModelInferRequest
from batchserve.rest import codec as rest_codec
from batchserve.rest import compression, json_text
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import grpc_requests, rest_requests
from tests.fuzz.properties import INPUT_NAMES, OUTPUT_NAMES, check_against_models, check_decoded
from tests.fuzz.values import HUGE_DIMS, ODD_DIMS, TRICKY_SHAPES, WIRES

_QUIET = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.large_base_example,
]
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20000")),
    deadline=None,
    suppress_health_check=_QUIET,
)
settings.register_profile(
    "fuzz-smoke", max_examples=40, deadline=None, suppress_health_check=_QUIET
)


@dataclass(frozen=True)
class Target:
    """A decoder under fuzzing: inputs to feed it and the property each must keep."""

    name: str
    inputs: st.SearchStrategy[Any]
    check: Callable[[Any], None]

    def run(self, profile: str) -> int:
        """Feed it inputs under a registered hypothesis profile (a failure raises); returns
        how many inputs the check ran on."""
        before = CALLS[self.check.__name__]
        given(self.inputs)(settings(settings.get_profile(profile))(self.check))()
        return CALLS[self.check.__name__] - before


CALLS: Counter[str] = Counter()
"""Inputs each check has run on, by name."""


def reported(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """``check`` adding the input it failed on to the error: hypothesis does not always
    print inputs drawn through composites when several distinct failures are found."""

    @functools.wraps(check)
    def checked(*args: Any, **kwargs: Any) -> None:
        CALLS[check.__name__] += 1
        try:
            check(*args, **kwargs)
        except Exception as exc:
            exc.add_note(f"input: {[*args, *kwargs.values()][0]!r:.4000}")
            raise

    return checked


def _echo(request: InferRequest) -> InferResponse:
    """The response an identity model would give: the inputs back, as the dataplane builds
    outputs (no parameters); an input from shared memory goes back there."""
    outputs = [
        Tensor(t.name, t.datatype, t.shape, t.data, {}, "shared_memory_region" in t.parameters)
        for t in request.inputs
    ]
    return InferResponse("m", "1", request.id, outputs)


def _rest(case: tuple[bytes, str | None]) -> None:
    body, header_value = case
    try:
        header_length = rest_codec.parse_header_length(header_value, len(body))
        request = rest_codec.decode_infer_request(body, header_length, "m", "1")
    except InvalidArgument:
        return
    check_decoded(request.inputs, len(body))
    check_against_models(request.inputs, request.outputs)
    try:
        chunks, json_length = rest_codec.encode_infer_response(_echo(request), request)
    except InvalidArgument as refused:  # as Triton refuses it: a BF16 output asked for as JSON
        refusal = str(refused)
    else:
        assert json_length in (None, len(chunks[0]))
        assert type(json_text.loads(bytes(chunks[0]))) is dict  # NaN and Infinity as Triton's
        return
    assert refusal.startswith("sending BF16 data via JSON is not supported")
    assert any(tensor.datatype.wire == "BF16" for tensor in request.inputs)


@reported
def check_rest(case: tuple[bytes, str | None]) -> None:
    _rest(case)


@reported
def check_rest_bytes(case: tuple[bytes, str | None]) -> None:
    """``check_rest`` under its own name, so each target keeps its own failure database."""
    _rest(case)


def _grpc(message: ModelInferRequest) -> None:
    try:
        request = grpc_codec.decode_infer_request(message)
    except InvalidArgument:
        return
    check_decoded(request.inputs, message.ByteSize())
    check_against_models(request.inputs, request.outputs)
    response = grpc_codec.encode_infer_response(_echo(request))
    assert len(response.raw_output_contents) == len(request.inputs)


@reported
def check_grpc_wire(data: bytes) -> None:
    try:
        message = ModelInferRequest.FromString(data)
    except DecodeError:
        return  # gRPC answers a message that does not parse before any decoder runs
    _grpc(message)


@reported
def check_grpc(message: ModelInferRequest) -> None:
    _grpc(message)


@reported
def check_header(case: tuple[str | None, int]) -> None:
    value, body_length = case
    try:
        length = rest_codec.parse_header_length(value, body_length)
    except InvalidArgument:
        return
    assert (length is None) == (value is None)
    assert length is None or 0 <= length <= body_length


@reported
def check_tensor_bytes(case: tuple[bytes, str, Any]) -> None:
    """Binary tensor data and the BYTES codec: decoded data encodes back to the very bytes."""
    buf, wire, shape = case
    try:
        dims = checked_shape(shape, tensor="t")
        array = array_from_bytes(buf, BY_WIRE[wire], dims, tensor="t")
    except InvalidArgument:
        return
    assert array.shape == dims
    assert bytes(array_to_bytes(array, BY_WIRE[wire])) == buf
    if wire != "BYTES":
        assert not array.flags.writeable  # a view of the request's bytes


@reported
def check_validation(case: tuple[list[Tensor], list[RequestedOutput] | None]) -> None:
    inputs, outputs = case
    check_against_models(inputs, outputs)


_WIRE = st.sampled_from(WIRES)
_ANY_SHAPE = (
    st.lists(st.integers(0, 5) | ODD_DIMS, max_size=3)
    | st.lists(st.sampled_from(HUGE_DIMS), min_size=2, max_size=3)
    | TRICKY_SHAPES
    | st.sampled_from([(3,), [True], "3"])
)
_ELEMENTS = st.lists(st.binary(max_size=5), max_size=6)


@st.composite
def _tensor_bytes(draw: st.DrawFn) -> tuple[bytes, str, Any]:
    wire, shape = draw(_WIRE), draw(_ANY_SHAPE)
    if wire != "BYTES":
        return draw(st.binary(max_size=40)), wire, shape
    items = draw(_ELEMENTS)
    buf = b"".join(len(i).to_bytes(4, "little") + i for i in items)
    damage = draw(st.integers(0, 4))
    if damage == 1:
        buf = buf[:-1]
    elif damage == 2:
        buf += b"\x00"
    elif damage == 3:
        buf = b"\xff\xff\xff\x7f" + buf
    elif damage == 4:
        buf = draw(st.binary(max_size=24))
    return buf, wire, shape


_SHAPE = st.lists(st.integers(0, 9), max_size=3).map(tuple)
_INPUT_NAME = st.sampled_from(INPUT_NAMES)
_OUTPUTS = st.none() | st.lists(
    st.sampled_from([*OUTPUT_NAMES, "nope"]).map(RequestedOutput), max_size=3
)


@st.composite
def _validation_cases(draw: st.DrawFn) -> tuple[list[Tensor], list[RequestedOutput] | None]:
    """Decoded-looking tensors named like the models' inputs, of any type and shape."""
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        wire, shape = draw(_WIRE), draw(_SHAPE)
        if shape and draw(st.booleans()):
            shape = (*shape[:-1], 0, draw(st.sampled_from([65536, 2**31])))  # no elements
        dtype = BY_WIRE[wire].numpy
        fill = (b"" if wire == "BYTES" else dtype.type(0)) if math.prod(shape) else None
        array = np.full(shape, fill, dtype=dtype)
        inputs.append(Tensor(draw(_INPUT_NAME), BY_WIRE[wire], shape, array))
    return inputs, draw(_OUTPUTS)


_INFLATE_LIMIT = 4096


@st.composite
def _compressed_bodies(draw: st.DrawFn) -> tuple[bytes, str, bytes | None]:
    """A Content-Encoding body: a real stream (whose payload is returned), one damaged by
    a cut, a flipped byte or trailing bytes, or arbitrary bytes; payloads may pass the limit."""
    encoding = draw(st.sampled_from([compression.GZIP, compression.DEFLATE]))
    if draw(st.integers(0, 3)) == 0:
        return draw(st.binary(max_size=64)), encoding, None
    size = draw(st.sampled_from([0, 1, 100, _INFLATE_LIMIT, _INFLATE_LIMIT + 1, 1 << 20]))
    payload = draw(st.binary(min_size=min(size, 8), max_size=8)) * max(1, size // 8)
    payload = payload[:size]
    body = compression.deflate([payload], encoding)
    damage = draw(st.integers(0, 3))
    if damage == 1 and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif damage == 2 and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]
    elif damage == 3:
        body += draw(st.binary(min_size=1, max_size=8))
    return body, encoding, payload if damage == 0 else None


@reported
def check_inflate(case: tuple[bytes, str, bytes | None]) -> None:
    """A compressed body inflates to at most the limit or is refused; an intact one whole."""
    body, encoding, payload = case
    try:
        inflated = compression.inflate(body, encoding, _INFLATE_LIMIT)
    except InvalidArgument:
        assert payload is None or len(payload) > _INFLATE_LIMIT
        return
    assert len(inflated) <= _INFLATE_LIMIT
    assert payload is None or inflated == payload


TARGETS: tuple[Target, ...] = (
    Target("rest-documents", rest_requests.documents(), check_rest),
    Target("rest-bytes", rest_requests.mutated_bodies(), check_rest_bytes),
    Target("grpc-messages", grpc_requests.messages(), check_grpc),
    Target("grpc-wire", grpc_requests.wire_bytes(), check_grpc_wire),
    Target("tensor-bytes", _tensor_bytes(), check_tensor_bytes),
    Target(
        "header-length",
        st.tuples(st.none() | st.text(max_size=16), st.integers(0, 2**40)),
        check_header,
    ),
    Target("validation", _validation_cases(), check_validation),
    Target("compressed-bodies", _compressed_bodies(), check_inflate),
)
