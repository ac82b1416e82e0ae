"""ONNX Runtime's exceptions as batchserve's errors, in one place: ``map_ort_errors``.

ORT raises its own pybind classes and plain RuntimeErrors whose text says what failed; the
server answers with a status per kind of failure (out of memory, bad request, bad model file).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)

_OOM = re.compile(
    r"Failed to allocate memory|bad allocation|std::bad_alloc|out of memory|BFCArena"
    r"|Available memory of \d+ is smaller than requested|ALLOC_FAILED",
    re.IGNORECASE,
)
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# ORT's own classes for a bad model file, as opposed to a failing runtime.
_BAD_MODEL = (
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NoModel,
    ort_state.NotImplemented,
    ort_state.Fail,
)


def ort_message(error: Exception) -> str:
    """The error's text without ORT's "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : " head."""
    return _ORT_PREFIX.sub("", str(error)).strip()


def translate_ort_error(error: Exception, where: str, *, loading: bool = False) -> BatchserveError:
    """The batchserve error for an exception ONNX Runtime raised; ``where`` names model or file."""
    message = f"{where}: {ort_message(error)}"
    if isinstance(error, MemoryError) or _OOM.search(str(error)):
        return OutOfMemory(message)
    if loading and isinstance(error, (*_BAD_MODEL, OSError)):
        return ModelConfigError(message)
    if not loading and isinstance(error, ort_state.InvalidArgument | ValueError):
        return InvalidArgument(message)
    return BackendError(message)


@contextmanager
def map_ort_errors(where: str, *, loading: bool = False) -> Iterator[None]:
    """The one boundary where ONNX Runtime's exceptions become batchserve's."""
    try:
        yield
    except BatchserveError:
        raise
    except Exception as exc:
        raise translate_ort_error(exc, where, loading=loading) from exc
