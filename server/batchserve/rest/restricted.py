"""Triton's restricted APIs over HTTP (``--http-restricted-api``): a request to an API of a
restricted group without the group's header and value is answered 403 in Triton's words,
before its route, its method or its body is looked at, as Triton checks it.

Only a server given restrictions runs this: the others serve their routes as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from batchserve.core.restrictions import Restriction
from batchserve.rest.codec import encode_error
from batchserve.rest.infer import ASGIApp, Receive, Scope, Send

_MODEL: Final = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
_CATEGORIES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern), category)
    for pattern, category in (
        (r"/v2/health/(?:live|ready)", "health"),
        (rf"{_MODEL}/ready", "health"),
        (r"/v2/models/stats", "statistics"),
        (rf"{_MODEL}/stats", "statistics"),
        (rf"{_MODEL}/(?:infer|generate|generate_stream)", "inference"),
        (rf"{_MODEL}/config", "model-config"),
        (rf"(?:/v2|{_MODEL})/trace/setting", "trace"),
        (r"/v2/logging", "logging"),
        (r"/v2/repository/.*", "model-repository"),
        (r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "shared-memory"),
        (r"/v2", "metadata"),
        (_MODEL, "metadata"),
    )
)
"""Each API's paths, as Triton's HTTP server routes them to its groups."""


def api_category(path: str) -> str | None:
    """The restricted-API group of a request path; None for a path no group covers."""
    for pattern, category in _CATEGORIES:
        if pattern.fullmatch(path):
            return category
    return None


def restricted(app: ASGIApp, restrictions: Mapping[str, Restriction]) -> ASGIApp:
    """``app`` behind the restrictions, or ``app`` itself when there are none."""
    if not restrictions:
        return app
    return RestrictedApis(app, restrictions)


class RestrictedApis:
    """Refuses requests to restricted APIs that do not carry their group's header."""

    def __init__(self, app: ASGIApp, restrictions: Mapping[str, Restriction]) -> None:
        self.app = app
        # by category: the header's name and value as the request's bytes, and the refusal
        self._wanted = {
            category: (r.header.encode(), r.value.encode(), r.refusal("API"))
            for category, r in restrictions.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            category = api_category(scope["path"])
            wanted = self._wanted.get(category) if category is not None else None
            if wanted is not None:
                name, value, refusal = wanted
                # the header's first value must be the value, as Triton reads it
                if next((v for k, v in scope["headers"] if k == name), None) != value:
                    await _forbidden(send, refusal)
                    return
        await self.app(scope, receive, send)


async def _forbidden(send: Send, message: str) -> None:
    body = encode_error(message)
    await send({
        "type": "http.response.start", "status": 403,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
