"""Protobuf's wire format, read by hand where protobuf must not read a message yet.

Parsing builds an object for every field, so a message is measured here first (``head.py``
for the inference calls, ``message_limits.py`` for the others). Framing protobuf would
refuse raises protobuf's own DecodeError; groups, which proto3 never writes but protobuf
reads, are followed, so that no message can make a reader give up and parse it whole.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

_START_GROUP, _END_GROUP = 3, 4


def varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where it ends."""
    value = shift = 0
    while shift < 64:
        if at >= len(data):
            raise DecodeError("a varint runs past the end of the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise DecodeError("a varint of more than 64 bits")


def short_varint(data: bytes, at: int) -> tuple[int, int]:
    """``varint``, the one-byte case (nearly every tag and length) first."""
    if at < len(data):
        byte = data[at]
        if byte < 0x80:
            return byte, at + 1
    return varint(data, at)


def value_span(data: bytes, tag: int, at: int, end: int) -> tuple[int, int]:
    """Where the value of a field with ``tag``, read up to ``at``, starts and ends (a
    length-delimited one's length skipped; a group's start or end has none)."""
    kind = tag & 7
    if kind == 2:
        length, at = varint(data, at)
        stop = at + length
    elif kind == 0:
        _, stop = varint(data, at)
    elif kind in (1, 5):
        stop = at + (8 if kind == 1 else 4)
    elif kind in (_START_GROUP, _END_GROUP):
        stop = at
    else:
        raise DecodeError(f"wire type {kind}, which protobuf does not have")
    if stop > end:
        raise DecodeError("a field runs past the end of the message")
    return at, stop


def delimited(data: bytes, at: int, end: int) -> tuple[int, int]:
    """Where the value of a length-delimited field whose length is at ``at`` starts and
    ends; its one-byte length, the usual one, read first."""
    if at < end and data[at] < 0x80:
        start = at + 1
        stop = start + data[at]
    else:
        length, start = varint(data, at)
        stop = start + length
    if stop > end:
        raise DecodeError("a field runs past the end of the message")
    return start, stop


def follow_group(groups: list[int], tag: int) -> None:
    """Keep ``groups`` (the field numbers of the groups open) as ``tag`` opens or ends one."""
    kind = tag & 7
    if kind == _START_GROUP:
        groups.append(tag >> 3)
    elif kind == _END_GROUP and (not groups or groups.pop() != tag >> 3):
        raise DecodeError("a group ends that did not start")


def count_fields(data: bytes, most: int) -> int:
    """The fields of the message in ``data`` outside its length-delimited values (those of
    groups included), counted up to ``most + 1`` at most."""
    groups: list[int] = []
    count = at = 0
    end = len(data)
    while at < end and count <= most:
        tag, at = short_varint(data, at)
        follow_group(groups, tag)
        at = value_span(data, tag, at, end)[1]
        count += 1
    if at == end and groups:
        raise DecodeError("a group does not end")
    return count
