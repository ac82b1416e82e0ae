"""ModelInferRequest read in two steps: its header first, typed contents once it is valid.

grpc parses a request before any handler sees it, and parsing typed ``contents`` builds
one object per element: 12 M empty ``bytes_contents`` (24 MiB) took 0.6 s of the event
loop before the datatype check could refuse them. ModelInfer and ModelStreamInfer are
therefore read as ``ModelInferRequestHead`` (proto/infer_head.proto): the same fields,
with each input's contents left as the bytes they arrived as. ``contents_of`` parses
them, which the codec does only after the header has been checked against the model.

Raw contents (what tritonclient and perf_analyzer send) are not parsed at all: ``read``
finds them in the message's bytes and keeps views of them (``WireRequest``). Protobuf would
copy each entry twice, once to parse the message and once more each time it is read; for a
432 KiB image that was 12 % of a gRPC server's CPU samples. Messages under ``VIEW_FROM``
bytes are parsed whole as before.

The scan also bounds what protobuf is asked to build. A message may be 64 MiB, and protobuf
builds an object for every field in it: 16 M empty inputs in 32 MiB held the server's event
loop for 15.7 s and 1.6 GiB before their count could be refused. The scan counts every field,
its inputs' and outputs' included, and a message past ``MAX_FIELDS`` (or with a shape past
``MAX_RANK``) is refused unparsed. Framing protobuf would refuse raises its ``DecodeError``
here, so that no message falls back to a whole parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from google.protobuf.message import DecodeError

from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import MAX_RANK, MAX_TENSORS, check_count
from batchserve.grpc.wire import delimited, follow_group, short_varint, value_span, varint
from batchserve.proto.grpc_service_pb2 import InferTensorContents, ModelInferRequest
from batchserve.proto.infer_head_pb2 import ModelInferRequestHead

Head = ModelInferRequestHead
InputHead = ModelInferRequestHead.InferInputTensor
VIEW_FROM = 32 * 1024
"""Messages at least this long have their raw contents viewed, not copied: below it, two
copies of the contents cost less than scanning the message in Python."""
MAX_FIELDS: Final = 64 * 1024
"""Fields a message of VIEW_FROM bytes or more may have, counted before protobuf reads it:
its own, and those of each input or output longer than SMALL_TENSOR_BYTES. A request of
MAX_TENSORS inputs, outputs and raw contents, each input with a name, datatype, shape,
contents and a parameter, has about 8,200. Past it the message is refused unparsed, having
cost the scan about 40 ms: protobuf builds an object for each field, and 16 M empty
inputs (32 MiB) held the server for 15.7 s and 1.6 GiB before their count was refused."""
MAX_SHAPE_BYTES: Final = MAX_RANK * 10
"""A packed shape of MAX_RANK dimensions, each a varint of at most 10 bytes."""
SMALL_TENSOR_BYTES: Final = 128
"""An input or output this short is not walked: it holds at most this many fields (a field
takes a byte at least), and a typical one (name, datatype, shape) takes about 30 bytes."""
RAW_INPUT_CONTENTS_TAG = (7 << 3) | 2
"""ModelInferRequest's field 7, length-delimited."""
_NAME_TAGS: Final = ((1 << 3) | 2, (2 << 3) | 2, (3 << 3) | 2)  # model name, version, id
_INPUTS_TAG: Final = (5 << 3) | 2
_OUTPUTS_TAG: Final = (6 << 3) | 2  # requested outputs
_TENSOR_TAGS: Final = (_INPUTS_TAG, _OUTPUTS_TAG)
_SHAPE_TAG: Final = (3 << 3) | 2  # an input's shape, packed


class Refused(Exception):
    """A message whose fields pass a limit; ``names``: its model name, version and id
    fields as they came, for the answer."""

    def __init__(self, reason: str, names: bytes = b"") -> None:
        super().__init__(reason)
        self.names = names


def _walk_tensor(data: bytes, at: int, end: int, budget: int) -> int:
    """Count the fields of one input or output at ``data[at:end]`` against ``budget``, and
    return what is left of it; Refused past it, or for a packed shape over MAX_RANK."""
    groups: list[int] = []
    while at < end:
        budget -= 1
        if budget < 0:
            raise Refused(_too_many())
        tag, at = varint(data, at)
        follow_group(groups, tag)
        start, at = value_span(data, tag, at, end)
        if tag == _SHAPE_TAG and not groups and at - start > MAX_SHAPE_BYTES:
            raise Refused(f"an input's shape has more than {MAX_RANK} dimensions")
    if groups:
        raise DecodeError("a group does not end")
    return budget


def _too_many() -> str:
    return (
        f"request message has more than {MAX_FIELDS} fields, its inputs' and outputs' "
        f"included (batchserve: at most {MAX_TENSORS} inputs, outputs and raw contents each)"
    )


def split_raw_contents(data: bytes) -> tuple[bytes, list[memoryview]]:
    """The message in ``data`` without its raw_input_contents, and views of those entries in
    order. Every field counts against MAX_FIELDS, an input's or output's too when it is
    longer than SMALL_TENSOR_BYTES; inputs, outputs and raw contents against MAX_TENSORS:
    Refused past either. Framing protobuf would refuse raises DecodeError."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    groups: list[int] = []
    kept_from = at = 0
    end = len(data)
    budget = MAX_FIELDS
    tensors = [0, 0]  # inputs, outputs
    while at < end:
        field_at = at
        tag = data[at]  # a one-byte tag read here: this loop runs for every request
        if tag < 0x80:
            at += 1
        else:
            tag, at = varint(data, at)
        budget -= 1
        if budget < 0:
            raise Refused(_too_many(), _names(data, field_at))
        if tag & 7 != 2 or groups:
            follow_group(groups, tag)
            at = value_span(data, tag, at, end)[1]
            continue
        start, at = delimited(data, at, end)
        if tag == RAW_INPUT_CONTENTS_TAG:
            rest.append(view[kept_from:field_at])
            raw.append(view[start:at])
            kept_from = at
            if len(raw) > MAX_TENSORS:  # one per input: no need to read the rest
                _check_counts(data, field_at, tensors, len(raw))
        elif tag in _TENSOR_TAGS:
            budget = _count_tensor(data, field_at, (start, at), budget, tensors, tag)
    _check_counts(data, end, tensors, len(raw))
    if groups:
        raise DecodeError("a group does not end")
    rest.append(view[kept_from:])
    return b"".join(rest), raw


def _count_tensor(
    data: bytes, field_at: int, value: tuple[int, int], budget: int, tensors: list[int], tag: int
) -> int:
    """Count the input or output whose field starts at ``field_at``, with its fields if it
    is longer than SMALL_TENSOR_BYTES; the budget left."""
    tensors[tag == _OUTPUTS_TAG] += 1
    start, stop = value
    if stop - start <= SMALL_TENSOR_BYTES:
        return budget
    try:
        return _walk_tensor(data, start, stop, budget)
    except Refused as refused:
        raise Refused(str(refused), _names(data, field_at)) from None


def _check_counts(data: bytes, upto: int, tensors: list[int], raw_count: int) -> None:
    """Refused when the inputs, outputs or raw contents read before ``upto`` are too many."""
    try:
        check_count(tensors[0], what="input")
        check_count(tensors[1], what="output")
    except InvalidArgument as error:
        raise Refused(error.message, _names(data, upto)) from None
    if raw_count > MAX_TENSORS:
        raise Refused(
            f"raw_input_contents has more than {MAX_TENSORS} entries (at most one per input, "
            f"and at most {MAX_TENSORS} inputs)",
            _names(data, upto),
        )


def _names(data: bytes, upto: int) -> bytes:
    """The model name, version and id fields among those before ``upto``, for a refusal's
    answer (read again: a refusal is rare, and keeping them would cost every request)."""
    found: list[bytes] = []
    at = 0
    while at < upto:
        field_at = at
        tag, at = short_varint(data, at)
        at = value_span(data, tag, at, upto)[1]
        if tag in _NAME_TAGS:
            found.append(data[field_at:at])
    return b"".join(found)


class WireRequest:
    """A ModelInferRequest as it came off the wire: its head, parsed without the raw input
    contents, and those contents (``raw``: views of the message's bytes where it was long
    enough to be worth it, else bytes). ``refusal``: why the message is refused unparsed."""

    __slots__ = ("_data", "head", "raw", "refusal")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.raw: list[bytes] | list[memoryview] = []
        self.refusal: str | None = None
        if len(data) >= VIEW_FROM:
            try:
                rest, self.raw = split_raw_contents(data)
            except Refused as refused:
                self.refusal = str(refused)
                self.head = _names_head(refused.names)
            else:
                self.head = Head.FromString(rest)
            return
        self.head = Head.FromString(data)
        if self.head.raw_input_contents:
            self.raw = list(self.head.raw_input_contents)
            del self.head.raw_input_contents[:]

    @property
    def nbytes(self) -> int:
        """The message's size as it arrived."""
        return len(self._data)

    @property
    def model_name(self) -> str:
        return self.head.model_name

    @property
    def model_version(self) -> str:
        return self.head.model_version

    @property
    def id(self) -> str:
        return self.head.id

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name: forwarded as is)
        """The message as it arrived."""
        return self._data


def _names_head(names: bytes) -> Head:
    """A refused message's model name, version and id, for the answer."""
    try:
        return Head.FromString(names)
    except DecodeError:
        return Head()


def read(data: bytes) -> WireRequest:
    """The request deserializer of the inference calls."""
    return WireRequest(data)


Request = ModelInferRequest | ModelInferRequestHead | WireRequest
"""What the codec takes: the server's requests off the wire, heads, or a full message from
an in-process caller."""


def wire_bytes(request: Request) -> int:
    """A request's size as a message: as it arrived, or as it would be sent."""
    return request.nbytes if isinstance(request, WireRequest) else request.ByteSize()


METHODS: Final = (
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelStreamInfer",
)
"""The calls whose requests are read as heads."""


def head_of(message: Request) -> Head:
    """``message`` as a head; a full message is re-read from its wire form (a copy). A
    request off the wire gives its head, whose raw contents are in ``raw_contents_of``."""
    if isinstance(message, Head):
        return message
    if isinstance(message, WireRequest):
        if message.refusal is not None:
            raise InvalidArgument(message.refusal)
        return message.head
    return Head.FromString(message.SerializeToString())


def raw_contents_of(message: Request) -> Sequence[bytes | memoryview]:
    """The message's raw input contents (a head's or a full message's are copied)."""
    if isinstance(message, WireRequest):
        return message.raw
    return list(message.raw_input_contents)


def contents_of(tensor: InputHead) -> InferTensorContents:
    """The input's typed contents, parsed: one object per element, so only once valid."""
    try:
        return InferTensorContents.FromString(tensor.contents)
    except DecodeError:
        raise InvalidArgument(
            f"tensor '{tensor.name}': contents is not a valid InferTensorContents message"
        ) from None
