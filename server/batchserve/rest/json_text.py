"""JSON text as Triton reads and writes it: with NaN, Infinity and -Infinity.

RFC 8259 has no such numbers, but Triton's JSON (RapidJSON with ``kParseNanAndInfFlag`` and
``kWriteNanAndInfFlag``) reads and writes them, and Python's ``json.dumps`` and
tritonclient's JSON tensors write them. orjson, the fast path, refuses them; a body
it refuses that holds one of the three words, up to ``MAX_NON_FINITE_BODY``, is read again
by Python's json, so only those bodies pay its speed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from batchserve.core.tensors import Array

_NON_FINITE_WORDS = (b"NaN", b"Infinity")
MAX_NON_FINITE_BODY = 1 << 20
"""Largest body read again by Python's json, about 7 times slower than orjson: a body of
the 16 MiB JSON limit would hold the event loop for half a second."""


class MalformedJson(ValueError):
    """The text is not JSON, even with Triton's three extra numbers."""


def loads(data: bytes | memoryview) -> Any:
    """The JSON value of ``data``; raises MalformedJson with the parser's reason."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        text = bytes(data)
        if not any(word in text for word in _NON_FINITE_WORDS):
            raise MalformedJson(str(error)) from None
        if len(text) > MAX_NON_FINITE_BODY:
            raise MalformedJson(
                f"{error} (NaN and Infinity are read in JSON bodies of up to "
                f"{MAX_NON_FINITE_BODY >> 20} MiB; send a larger tensor holding them as "
                "binary data)"
            ) from None
        try:
            value = json.loads(text)
            # what else Python's json takes and orjson does not (lone surrogates, integers
            # past 64 bits) stays refused: orjson will not write it either
            orjson.dumps(value)
        except RecursionError:
            raise MalformedJson(str(error)) from None  # orjson's own depth text
        except (ValueError, orjson.JSONEncodeError) as retry_error:
            raise MalformedJson(str(retry_error)) from None
        return value


def with_non_finite(flat: Array) -> orjson.Fragment:
    """A flat float array holding NaN or infinity as JSON text, each written as Triton
    writes it (NaN, Infinity, -Infinity) and every other number as orjson writes it."""
    parts = orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY).split(b"null")
    words = [
        b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"
        for value in flat[~np.isfinite(flat)]
    ]
    pieces = [parts[0]]
    for word, part in zip(words, parts[1:], strict=True):
        pieces += [word, part]
    return orjson.Fragment(b"".join(pieces))
