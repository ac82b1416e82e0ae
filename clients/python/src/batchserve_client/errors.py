"""One exception root, with the server's HTTP status or gRPC code mapped to a subclass.

    BatchserveClientError
    ├── InvalidArgument     400 (and other 4xx)  INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION
    │   └── PayloadTooLarge 413                  RESOURCE_EXHAUSTED
    ├── Unauthenticated     401                  UNAUTHENTICATED
    ├── PermissionDenied    403                  PERMISSION_DENIED
    ├── NotFound            404                  NOT_FOUND
    ├── Unimplemented       405, 501             UNIMPLEMENTED
    ├── Unavailable         503, 429, no connection     UNAVAILABLE         (retried)
    ├── ConnectionLost      the connection broke after the request was sent
    ├── DeadlineExceeded    504, 408, the call's timeout DEADLINE_EXCEEDED
    ├── Cancelled                                CANCELLED
    ├── InvalidResponse     the server's answer could not be read
    └── Internal            500 (and other 5xx)  INTERNAL, UNKNOWN, DATA_LOSS, ...

Every error carries the server's own message (the ``error`` field of an HTTP error
body, the details of a gRPC status) and, where there was one, the HTTP ``status``, the
gRPC ``code`` name and the ``Retry-After`` delay.
"""

from __future__ import annotations

from typing import Final


class BatchserveClientError(Exception):
    """Root of every error this library raises.

    Args:
        message: the server's message, or what went wrong on the client's side.
        status: the HTTP status, when the server answered over HTTP.
        code: the gRPC status code's name (``"UNAVAILABLE"``), when it answered over gRPC.
        retry_after: seconds the server asked the client to wait (HTTP ``Retry-After``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after


class InvalidArgument(BatchserveClientError):
    """The request is wrong: the message names the tensor and the problem."""


class PayloadTooLarge(InvalidArgument):
    """The request body is larger than the server accepts."""


class Unauthenticated(BatchserveClientError):
    """The call needs a token that is missing or wrong."""


class PermissionDenied(BatchserveClientError):
    """The server has this call switched off."""


class NotFound(BatchserveClientError):
    """Unknown model or version."""


class Unimplemented(BatchserveClientError):
    """The server does not offer this call."""


class Unavailable(BatchserveClientError):
    """The server cannot take the request now (not ready, queue full, draining, no
    connection); the work was not done, so any call may be retried."""


class ConnectionLost(BatchserveClientError):
    """The connection broke after the request was sent: it may or may not have run,
    so only idempotent calls are retried."""


class DeadlineExceeded(BatchserveClientError):
    """The call's timeout passed, on the client's side or in the server's queue."""


class Cancelled(BatchserveClientError):
    """The call was cancelled before it finished."""


class InvalidResponse(BatchserveClientError):
    """The server's answer does not follow the protocol."""


class Internal(BatchserveClientError):
    """The server failed while handling the request."""


HTTP_ERRORS: Final[dict[int, type[BatchserveClientError]]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    405: Unimplemented,
    408: DeadlineExceeded,
    413: PayloadTooLarge,
    429: Unavailable,
    501: Unimplemented,
    503: Unavailable,
    504: DeadlineExceeded,
}

GRPC_ERRORS: Final[dict[str, type[BatchserveClientError]]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "FAILED_PRECONDITION": InvalidArgument,
    "RESOURCE_EXHAUSTED": PayloadTooLarge,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "NOT_FOUND": NotFound,
    "UNIMPLEMENTED": Unimplemented,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CANCELLED": Cancelled,
}


def from_http_status(
    status: int, message: str, retry_after: float | None = None
) -> BatchserveClientError:
    """The error for an HTTP error status; unlisted 4xx are InvalidArgument, 5xx Internal."""
    default = InvalidArgument if 400 <= status < 500 else Internal
    error_class = HTTP_ERRORS.get(status, default)
    return error_class(message, status=status, retry_after=retry_after)


def from_grpc_code(code: str, message: str) -> BatchserveClientError:
    """The error for a gRPC status code's name; unlisted codes are Internal."""
    return GRPC_ERRORS.get(code, Internal)(message, code=code)
