"""From a URL and the client's settings to the protocol's calls and the runner that sends them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from batchserve_client._call import Api, AsyncRunner, SyncRunner
from batchserve_client._grpc import GrpcApi
from batchserve_client._grpc_io import AsyncGrpcRunner, GrpcRunner, channel_options
from batchserve_client._http import HttpApi
from batchserve_client._http_io import AsyncHttpRunner, HttpRunner

_SCHEMES = {"http": False, "https": True, "grpc": False, "grpcs": True}


@dataclass(frozen=True, slots=True)
class Settings:
    """What a client was made with.

    Args:
        url: ``http://host:port[/prefix]``, ``https://...``, ``grpc://host:port`` or
            ``grpcs://host:port`` (TLS with the system's root certificates).
        connect_timeout: seconds a connection may take to open.
        max_backoff: the retry policy's longest wait, which bounds gRPC's reconnect backoff.
        token: sent as ``Authorization: Bearer <token>`` (gRPC metadata ``authorization``).
        headers: extra HTTP headers, or gRPC metadata.
        binary_data: HTTP only: tensors as binary data (True) or JSON (False).
    """

    url: str
    connect_timeout: float
    max_backoff: float
    token: str | None
    headers: Mapping[str, str]
    binary_data: bool

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme not in _SCHEMES or "://" not in self.url:
            raise ValueError(
                f"the URL must start with http://, https://, grpc:// or grpcs://: {self.url!r}"
            )

    @property
    def is_grpc(self) -> bool:
        return self.url.startswith("grpc")

    def metadata(self) -> dict[str, str]:
        headers = {key.lower(): value for key, value in self.headers.items()}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def grpc_target(self) -> tuple[str, bool]:
        """``host:port`` and whether to use TLS."""
        parts = urlsplit(self.url)
        if parts.port is None or parts.path not in ("", "/"):
            raise ValueError(f"a gRPC URL is scheme://host:port, got {self.url!r}")
        return parts.netloc, _SCHEMES[parts.scheme]


def open_sync(settings: Settings) -> tuple[Api[Any, Any], SyncRunner[Any, Any]]:
    if not settings.is_grpc:
        runner = HttpRunner(
            settings.url, headers=settings.metadata(), connect_timeout=settings.connect_timeout
        )
        return HttpApi(binary_data=settings.binary_data), runner
    target, secure = settings.grpc_target()
    options = channel_options(settings.connect_timeout, settings.max_backoff)
    metadata = tuple(settings.metadata().items())
    return GrpcApi(), GrpcRunner(target, secure=secure, options=options, metadata=metadata)


def open_async(settings: Settings) -> tuple[Api[Any, Any], AsyncRunner[Any, Any]]:
    if not settings.is_grpc:
        runner = AsyncHttpRunner(
            settings.url, headers=settings.metadata(), connect_timeout=settings.connect_timeout
        )
        return HttpApi(binary_data=settings.binary_data), runner
    target, secure = settings.grpc_target()
    options = channel_options(settings.connect_timeout, settings.max_backoff)
    metadata = tuple(settings.metadata().items())
    return GrpcApi(), AsyncGrpcRunner(target, secure=secure, options=options, metadata=metadata)
