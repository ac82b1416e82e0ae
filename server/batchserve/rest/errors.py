"""The one place HTTP errors are rendered: ``{"error": message}`` with the mapped status."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchserve.core.errors import BatchserveError, Unavailable, http_status, public_message
from batchserve.observability.refusals import REFUSALS, Protocol
from batchserve.rest.codec import encode_error

logger = logging.getLogger(__name__)


def error_headers(error: BaseException) -> list[tuple[bytes, bytes]]:
    """Content type, plus Retry-After on 503 so clients back off instead of hammering."""
    headers = [(b"content-type", b"application/json")]
    if isinstance(error, Unavailable) and error.retry_after_seconds:
        headers.append((b"retry-after", str(error.retry_after_seconds).encode()))
    return headers


def error_body(error: BaseException) -> tuple[int, bytes]:
    """Status and body for any exception; unexpected ones are logged with their traceback."""
    if not isinstance(error, BatchserveError):
        logger.error("unexpected error", exc_info=error)
    REFUSALS.count_error(Protocol.HTTP, error)
    return http_status(error), encode_error(public_message(error))


def _response(error: BaseException) -> Response:
    status, body = error_body(error)
    headers = {k.decode(): v.decode() for k, v in error_headers(error)}
    return Response(body, status_code=status, headers=headers)


async def handle_batchserve_error(_: Request, exc: Exception) -> Response:
    return _response(exc)


async def handle_validation_error(_: Request, exc: Exception) -> Response:
    """FastAPI's 422 for schema errors becomes the protocol's 400."""
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()
    )
    body = encode_error(f"invalid request: {problems}")
    return Response(body, status_code=400, media_type="application/json")


async def handle_http_exception(_: Request, exc: Exception) -> Response:
    """Starlette's 404/405 keep their status but use the protocol's error body."""
    assert isinstance(exc, HTTPException)
    body = encode_error(str(exc.detail))
    return Response(body, status_code=exc.status_code, media_type="application/json",
                    headers=exc.headers)  # fmt: skip


async def handle_client_disconnect(_: Request, exc: Exception) -> Response:
    """A client gone (or timed out) while its body was read: nobody is left to answer, and
    it is no server error to log with a traceback."""
    assert isinstance(exc, ClientDisconnect)
    return Response(encode_error("client disconnected"), status_code=400,
                    media_type="application/json")  # fmt: skip


class UnexpectedErrors:
    """An exception no handler took, answered like every other error: ``{"error": ...}``,
    500, logged once at ERROR with its traceback. Starlette's own last resort answers plain
    text and re-raises, for the server to log the traceback a second time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:  # too late for an answer: the server ends the response
                raise
            await _response(exc)(scope, receive, send)
