"""Request bodies of the framework's routes, read no further than a limit.

The inference route reads its body from ASGI itself (``infer.read_body``); every other route
that takes a body (model control, shared-memory registration) reads it here.
"""

from __future__ import annotations

from starlette.requests import Request

from batchserve.core.errors import PayloadTooLarge


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
