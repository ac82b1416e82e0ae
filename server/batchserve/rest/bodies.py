"""Request bodies of the framework's routes, read no further than a limit.

The inference route reads its body from ASGI itself (``infer.read_body``); every other route
that takes a body (model control, shared-memory registration) reads it here.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from batchserve.core.errors import InvalidArgument, PayloadTooLarge


async def read_limited(request: Request, limit: int, what: str) -> bytes:
    """The whole body of ``request``, refused as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"{what} is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body; empty is ``{}``."""
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return data
