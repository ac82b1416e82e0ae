"""From a URL and the client's settings to the protocol's calls and the runner that sends them."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc

from batchserve_client._call import Api, AsyncRunner, SyncRunner
from batchserve_client._grpc import GrpcApi
from batchserve_client._grpc_io import AsyncGrpcRunner, GrpcRunner, channel_options
from batchserve_client._http import HttpApi
from batchserve_client._http_io import AsyncHttpRunner, HttpRunner
from batchserve_client.tls import TlsConfig

_SCHEMES = {"http": False, "https": True, "grpc": False, "grpcs": True}


@dataclass(frozen=True, slots=True)
class Settings:
    """What a client was made with.

    Args:
        url: ``http://host:port[/prefix]``, ``https://...``, ``grpc://host:port`` or
            ``grpcs://host:port`` (TLS with the system's root certificates).
        tls: for ``https://`` and ``grpcs://``: a private CA, a client certificate.
        connect_timeout: seconds a connection may take to open.
        max_backoff: the retry policy's longest wait, which bounds gRPC's reconnect backoff.
        token: sent as ``Authorization: Bearer <token>`` (gRPC metadata ``authorization``).
        headers: extra HTTP headers, or gRPC metadata.
        binary_data: HTTP only: tensors as binary data (True) or JSON (False).
    """

    url: str
    tls: TlsConfig | None
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
        if self.tls is not None and not _SCHEMES[urlsplit(self.url).scheme]:
            raise ValueError(f"tls= needs an https:// or grpcs:// URL, got {self.url!r}")

    @property
    def is_grpc(self) -> bool:
        return self.url.startswith("grpc")

    def metadata(self) -> dict[str, str]:
        headers = {key.lower(): value for key, value in self.headers.items()}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def grpc_target(self) -> tuple[str, grpc.ChannelCredentials | None]:
        """``host:port`` and the channel's credentials (None: plain text)."""
        parts = urlsplit(self.url)
        if parts.port is None or parts.path not in ("", "/"):
            raise ValueError(f"a gRPC URL is scheme://host:port, got {self.url!r}")
        if not _SCHEMES[parts.scheme]:
            return parts.netloc, None
        tls = self.tls or TlsConfig()
        return parts.netloc, tls.grpc_credentials()

    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify``: the system's roots unless a TlsConfig says otherwise."""
        return True if self.tls is None else self.tls.ssl_context()


def open_sync(settings: Settings) -> tuple[Api[Any, Any], SyncRunner[Any, Any]]:
    if not settings.is_grpc:
        runner = HttpRunner(
            settings.url,
            headers=settings.metadata(),
            connect_timeout=settings.connect_timeout,
            verify=settings.verify(),
        )
        return HttpApi(binary_data=settings.binary_data), runner
    target, credentials = settings.grpc_target()
    options = channel_options(settings.connect_timeout, settings.max_backoff)
    metadata = tuple(settings.metadata().items())
    return GrpcApi(), GrpcRunner(
        target, credentials=credentials, options=options, metadata=metadata
    )


def open_async(settings: Settings) -> tuple[Api[Any, Any], AsyncRunner[Any, Any]]:
    if not settings.is_grpc:
        runner = AsyncHttpRunner(
            settings.url,
            headers=settings.metadata(),
            connect_timeout=settings.connect_timeout,
            verify=settings.verify(),
        )
        return HttpApi(binary_data=settings.binary_data), runner
    target, credentials = settings.grpc_target()
    options = channel_options(settings.connect_timeout, settings.max_backoff)
    metadata = tuple(settings.metadata().items())
    return GrpcApi(), AsyncGrpcRunner(
        target, credentials=credentials, options=options, metadata=metadata
    )
