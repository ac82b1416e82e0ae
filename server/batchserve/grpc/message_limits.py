"""Bounds on the messages of the calls other than inference, checked before protobuf reads
them.

grpc hands a call's message to protobuf before any handler runs: a settings update before
its token is checked, a model load while model control is off. Protobuf builds an object for
every field, and a message may be as large as an inference request: two 32 MiB
LogSettings requests of empty entries held the server for 3.6 s and 880 MiB before they were
refused. The inference calls are measured by their own scan (``head.py``). Of the others,
only a model load carries more than a few fields' worth of bytes (its files, in its
parameters); the rest are held to MAX_MESSAGE_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from batchserve.grpc.wire import count_fields

MAX_MESSAGE_BYTES: Final = 64 * 1024
"""A message of a call other than inference or model load; the largest Triton's clients send
(trace settings) take a few hundred bytes."""
MAX_LOAD_FIELDS: Final = 1024
"""Fields of a model load request larger than MAX_MESSAGE_BYTES: a repository, a model name
and a parameter for the config and each file."""
MODEL_LOAD: Final = "/inference.GRPCInferenceService/RepositoryModelLoad"

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a call's deserializer gives instead of its message: the call is answered with
    ``status`` before its handler runs (a deserializer that raises gets INTERNAL)."""

    status: grpc.StatusCode
    message: str


def bounded(method: str, parse: Deserializer | None) -> Deserializer:
    """``parse`` (None: the bytes as they came), refusing messages past this module's limits."""

    def read(data: bytes) -> Any:
        refusal = _refusal(method, data)
        if refusal is not None:
            return refusal
        return data if parse is None else parse(data)

    return read


def _refusal(method: str, data: bytes) -> Refusal | None:
    size = len(data)
    if size <= MAX_MESSAGE_BYTES:
        return None
    name = method.rsplit("/", 1)[-1]
    if method != MODEL_LOAD:
        return Refusal(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max ({size} vs. {MAX_MESSAGE_BYTES}) (batchserve: "
            f"a {name} request is {MAX_MESSAGE_BYTES} bytes at most; only inference and "
            "model load take more)",
        )
    if count_fields(data, MAX_LOAD_FIELDS) > MAX_LOAD_FIELDS:
        return Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{name} request has more than {MAX_LOAD_FIELDS} fields (batchserve: a "
            "repository, a model name, and a parameter for its config and each file)",
        )
    return None
