"""One error hierarchy, mapped once to HTTP status codes and gRPC status codes.

    BatchserveError
    ├── InvalidArgument        400  INVALID_ARGUMENT   the client sent something wrong
    │   ├── ModelConfigError   400  INVALID_ARGUMENT   a config.pbtxt or model file is wrong
    │   ├── PayloadTooLarge    413  RESOURCE_EXHAUSTED the body is over the size limit
    │   └── AlreadyExists      400  ALREADY_EXISTS     the name is taken (Triton's codes)
    ├── NotFound               404  NOT_FOUND          unknown model or version
    ├── Unavailable            503  UNAVAILABLE        not ready, draining
    │   ├── Overloaded         503  UNAVAILABLE        queue full: retry later
    │   └── ControlDisabled    503  UNAVAILABLE        model control is off (Triton's status)
    ├── DeadlineExceeded       504  DEADLINE_EXCEEDED  timed out before it could run
    ├── PermissionDenied       403  PERMISSION_DENIED  the call is switched off
    ├── Unauthenticated        401  UNAUTHENTICATED    token missing or wrong
    ├── Unsupported            501  UNIMPLEMENTED      a setting batchserve cannot honour
    └── Internal               500  INTERNAL           our fault, or the backend's
        ├── InternalRefusal    500  INTERNAL           a refusal Triton answers INTERNAL
        ├── BackendError       500  INTERNAL           the runtime failed to run a batch
        │   └── OutOfMemory    500  INTERNAL           the runtime ran out of memory
        └── DeviceUnavailable  500  INTERNAL           a GPU was asked for and none is there

The tables are looked up along the class's MRO (as Starlette does for exception
handlers), so a subclass inherits its parent's codes unless it names its own.
"""

from __future__ import annotations

from typing import Final, TypeVar

import grpc


class BatchserveError(Exception):
    """Root of every error batchserve raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(BatchserveError):
    """The request is malformed; the message names the tensor and the problem."""


class ModelConfigError(InvalidArgument):
    """A model's configuration or file is wrong; the message names file and field."""


class ModelFileError(ModelConfigError):
    """The model's files, or the runtime given them, refused a model whose config reads
    well: Triton finds these loading the model ("load failed for model"), not polling the
    repository ("failed to poll from model repository")."""


class PayloadTooLarge(InvalidArgument):
    """The request body is larger than the server accepts."""


class AlreadyExists(InvalidArgument):
    """The name (a shared-memory region's) is registered already."""


class NotFound(BatchserveError):
    """The model or version does not exist."""


class Unavailable(BatchserveError):
    """The model or server cannot take the request now (loading, failed, draining)."""

    retry_after_seconds: int = 1


class Overloaded(Unavailable):
    """The model's queue is full; the client should retry after a pause."""


class ControlDisabled(Unavailable):
    """Load or unload asked of a server whose model control is off: Triton answers
    UNAVAILABLE; no Retry-After, as retrying cannot help."""

    retry_after_seconds = 0


class VersionRetired(Unavailable):
    """A version served once and no longer: Triton answers UNAVAILABLE ("not at ready
    state"); no Retry-After, as only a load that brings the version back can help."""

    retry_after_seconds = 0


class DeadlineExceeded(BatchserveError):
    """The request's deadline passed before it could be answered."""


class Cancelled(BatchserveError):
    """Cancelled by the server on its client's behalf: another request of its sequence was
    cancelled, which cancels the whole sequence (Triton's CANCELLED: gRPC CANCELLED, and
    400 over HTTP, which has no code of its own for it there)."""


class PermissionDenied(BatchserveError):
    """The call is disabled by the server's configuration."""


class Unauthenticated(BatchserveError):
    """The call needs a token that is missing or wrong."""


class Unsupported(BatchserveError):
    """The request is well formed but asks for something batchserve does not do (Triton's
    UNSUPPORTED: 501 over HTTP, UNIMPLEMENTED over gRPC)."""


class Internal(BatchserveError):
    """Something failed on the server's side."""


class InternalRefusal(Internal):
    """A refusal Triton answers with INTERNAL, whose clients check that status: the
    request's own fault, so never logged as the server's."""


class BackendError(Internal):
    """The runtime failed while loading or running a model."""


class OutOfMemory(BackendError):
    """The runtime could not allocate memory for a batch."""


class DeviceUnavailable(Internal):
    """A GPU (or a GPU runtime) was asked for and is not present."""


class CannotStart(Exception):
    """The server cannot start as told: a port it cannot have (taken, or an address that is
    not this host's), a model repository that is not a directory. No request's error: the
    server says why and exits."""


HTTP_STATUS: Final[dict[type[BaseException], int]] = {
    InvalidArgument: 400,
    PayloadTooLarge: 413,
    AlreadyExists: 400,
    Unauthenticated: 401,
    PermissionDenied: 403,
    NotFound: 404,
    Unavailable: 503,
    DeadlineExceeded: 504,
    Cancelled: 400,
    Unsupported: 501,
    Internal: 500,
    BaseException: 500,
}

GRPC_STATUS: Final[dict[type[BaseException], grpc.StatusCode]] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Cancelled: grpc.StatusCode.CANCELLED,
    Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    Internal: grpc.StatusCode.INTERNAL,
    BaseException: grpc.StatusCode.INTERNAL,
}


TRITON_CODE: Final[dict[type[BaseException], str]] = {
    InvalidArgument: "Invalid argument",
    AlreadyExists: "Already exists",
    NotFound: "Not found",
    Unavailable: "Unavailable",
    Cancelled: "Cancelled",
    Unsupported: "Unsupported",
    Internal: "Internal",
    BaseException: "Unknown",
}
"""Triton's names of its status codes, as its texts quote a status (``Status::AsString``)."""

_T = TypeVar("_T")


def _lookup(table: dict[type[BaseException], _T], error: BaseException) -> _T:
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    raise AssertionError("BaseException is always in the table")  # pragma: no cover


def decoupled_refusal(protocol: str) -> Unsupported:
    """Triton's answer to a one-response call (HTTP ``infer``, gRPC ``ModelInfer``) for a
    model that may answer any number of times."""
    where = "ModelInfer RPC" if protocol == "grpc" else "HTTP end point"
    return Unsupported(
        f"{where} doesn't support models with decoupled transaction policy (batchserve: use "
        "gRPC ModelStreamInfer, or HTTP generate or generate_stream)"
    )


def http_status(error: BaseException) -> int:
    """HTTP status for any exception; unexpected ones are 500."""
    return _lookup(HTTP_STATUS, error)


def grpc_status(error: BaseException) -> grpc.StatusCode:
    """gRPC status for any exception; unexpected ones are INTERNAL."""
    return _lookup(GRPC_STATUS, error)


def triton_code(error: BaseException) -> str:
    """Triton's name for the status of any exception ("Internal", "Invalid argument")."""
    return _lookup(TRITON_CODE, error)


def public_message(error: BaseException) -> str:
    """The text a client sees: ours verbatim, anything unexpected without internals."""
    if isinstance(error, BatchserveError):
        return error.message
    return f"internal error: {type(error).__name__}"
