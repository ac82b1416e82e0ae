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
bytes, and any whose framing the scan does not follow, are parsed whole as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from google.protobuf.message import DecodeError

from batchserve.core.errors import InvalidArgument
from batchserve.proto.grpc_service_pb2 import InferTensorContents, ModelInferRequest
from batchserve.proto.infer_head_pb2 import ModelInferRequestHead

Head = ModelInferRequestHead
InputHead = ModelInferRequestHead.InferInputTensor
VIEW_FROM = 32 * 1024
"""Messages at least this long have their raw contents viewed, not copied: below it, two
copies of the contents cost less than scanning the message in Python."""
RAW_INPUT_CONTENTS_TAG = (7 << 3) | 2
"""ModelInferRequest's field 7, length-delimited."""


class _Unfollowed(Exception):
    """The scan met framing it does not follow; the message is parsed whole instead."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        if at >= len(data):
            raise _Unfollowed
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise _Unfollowed


def split_raw_contents(data: bytes) -> tuple[bytes, list[memoryview]]:
    """The message in ``data`` without its raw_input_contents, and views of those entries
    in order. Only top-level fields are walked; raises ``_Unfollowed`` on anything but the
    four wire types proto3 writes, or a field that runs past the end."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    kept_from = at = 0
    end = len(data)
    while at < end:
        field_at = at
        tag, at = _varint(data, at)
        kind = tag & 7
        if kind == 2:
            length, at = _varint(data, at)
            stop = at + length
            if stop > end:
                raise _Unfollowed
            if tag == RAW_INPUT_CONTENTS_TAG:
                rest.append(view[kept_from:field_at])
                raw.append(view[at:stop])
                kept_from = stop
            at = stop
        elif kind == 0:
            _, at = _varint(data, at)
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise _Unfollowed
    if at != end:
        raise _Unfollowed
    rest.append(view[kept_from:])
    return b"".join(rest), raw


class WireRequest:
    """A ModelInferRequest as it came off the wire: its head, parsed without the raw input
    contents, and those contents (``raw``: views of the message's bytes where it was long
    enough to be worth it, else bytes)."""

    __slots__ = ("_data", "head", "raw")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.raw: list[bytes] | list[memoryview] = []
        if len(data) >= VIEW_FROM:
            try:
                rest, self.raw = split_raw_contents(data)
            except _Unfollowed:
                pass
            else:
                self.head = Head.FromString(rest)
                return
        self.head = Head.FromString(data)
        if self.head.raw_input_contents:
            self.raw = list(self.head.raw_input_contents)
            del self.head.raw_input_contents[:]

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


def read(data: bytes) -> WireRequest:
    """The request deserializer of the inference calls."""
    return WireRequest(data)


Request = ModelInferRequest | ModelInferRequestHead | WireRequest
"""What the codec takes: the server's requests off the wire, heads, or a full message from
an in-process caller."""

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
