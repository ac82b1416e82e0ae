"""Request bodies of the framework's routes, read no further than a limit, and the words for
a body past one.

The inference route reads its body from ASGI itself (``infer.read_body``); every other route
that takes a body (model control, shared-memory registration) reads it here. The refusals
are Triton's texts, which its clients and tests look for; Triton reads a whole body before
measuring it, where a body here is refused as soon as it passes the limit, so a size counted
rather than declared is "at least" that size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from batchserve.core.errors import InvalidArgument, PayloadTooLarge
from batchserve.rest import json_text

TooLarge = Callable[[str, int], PayloadTooLarge]
"""The refusal of a body of a size (its text: "N", "at least N") past a limit."""
RAISE_IT = "Use --http-max-input-size to increase the limit."


def json_too_large(size: str, limit: int) -> PayloadTooLarge:
    """A JSON body or JSON header past the JSON limit, in Triton's words."""
    return PayloadTooLarge(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} "
        f"bytes. {RAISE_IT}"
    )


def binary_too_large(size: str, limit: int) -> PayloadTooLarge:
    """A body with binary tensors past its limit, worded as Triton's JSON and input sizes."""
    return PayloadTooLarge(
        f"request size of {size} bytes exceeds the maximum allowed input size of {limit} "
        f"bytes. {RAISE_IT}"
    )


def raw_too_large(size: str, limit: int) -> PayloadTooLarge:
    """A raw binary body (the one input, no JSON header) past its limit, in Triton's words."""
    return PayloadTooLarge(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
        f"{limit} bytes. {RAISE_IT}"
    )


def inflated_too_large(limit: int) -> PayloadTooLarge:
    """A compressed body whose inflated bytes pass its limit, in Triton's words."""
    return PayloadTooLarge(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {RAISE_IT}"
    )


async def read_limited(request: Request, limit: int, too_large: TooLarge = json_too_large) -> bytes:
    """The whole body of ``request``, refused as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"at least {size}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body; empty is ``{}``."""
    if not body.strip():
        return {}
    try:
        data = json_text.loads(body)
    except json_text.MalformedJson as exc:
        raise InvalidArgument(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return data
