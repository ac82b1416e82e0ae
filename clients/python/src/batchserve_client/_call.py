"""The seam between what a call means and how it travels.

Each protocol has an ``Api`` that builds every call without doing any I/O (a request,
how to read its answer, when it may be retried), and a sync and an async runner that
only send requests. The clients pair the two, so the meaning of each call is written
once per protocol and the I/O once per protocol and mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from batchserve_client._infer import InferRequest
from batchserve_client.results import InferResult, ModelMetadata, ServerMetadata
from batchserve_client.retry import Retry

Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")
Req_contra = TypeVar("Req_contra", contravariant=True)
Resp_co = TypeVar("Resp_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Call(Generic[Req, Resp, T]):
    """One exchange: the request, how to read the answer, and when it may be retried."""

    request: Req
    read: Callable[[Resp], T]
    retry: Retry


class Api(Protocol[Req, Resp]):
    """Every call the clients offer, as one protocol spells it."""

    def is_live(self) -> Call[Req, Resp, bool]: ...

    def is_ready(self) -> Call[Req, Resp, bool]: ...

    def is_model_ready(self, model: str, version: str) -> Call[Req, Resp, bool]: ...

    def server_metadata(self) -> Call[Req, Resp, ServerMetadata]: ...

    def model_metadata(self, model: str, version: str) -> Call[Req, Resp, ModelMetadata]: ...

    def model_config(self, model: str, version: str) -> Call[Req, Resp, dict[str, Any]]: ...

    def model_statistics(
        self, model: str, version: str
    ) -> Call[Req, Resp, list[dict[str, Any]]]: ...

    def repository_index(self, ready: bool) -> Call[Req, Resp, list[dict[str, Any]]]: ...

    def load_model(self, model: str) -> Call[Req, Resp, None]: ...

    def unload_model(self, model: str) -> Call[Req, Resp, None]: ...

    def infer(self, request: InferRequest) -> Call[Req, Resp, InferResult]: ...


class SyncRunner(Protocol[Req_contra, Resp_co]):
    """Sends one request and returns the raw answer, raising the library's errors."""

    def send(self, request: Req_contra, timeout: float | None) -> Resp_co: ...

    def close(self) -> None: ...


class AsyncRunner(Protocol[Req_contra, Resp_co]):
    """``SyncRunner`` for asyncio."""

    async def send(self, request: Req_contra, timeout: float | None) -> Resp_co: ...

    async def close(self) -> None: ...
