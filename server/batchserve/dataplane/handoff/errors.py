"""Errors across the process boundary: by the name of the nearest class in
``core.errors``, so status codes, Retry-After and the refusal counts are those of the
error raised in the other process."""

from __future__ import annotations

from batchserve.core import errors
from batchserve.core.errors import BatchserveError, Internal, public_message

_BY_NAME: dict[str, type[BatchserveError]] = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, BatchserveError)
}


def error_frame(error: BaseException) -> tuple[str, str]:
    """(class name, message) of ``error``: the nearest core class, Internal for others."""
    for cls in type(error).__mro__:
        if cls.__name__ in _BY_NAME and _BY_NAME[cls.__name__] is cls:
            return cls.__name__, public_message(error)
    return Internal.__name__, public_message(error)


def error_from(name: str, message: str) -> BatchserveError:
    return _BY_NAME.get(name, Internal)(message)
