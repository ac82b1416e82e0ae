"""Sending REST requests with httpx: one pooled client per batchserve client, so
connections are kept alive and reused, and httpx's errors as the library's."""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx

from batchserve_client._http import HttpRequest
from batchserve_client.errors import (
    ConnectionLost,
    DeadlineExceeded,
    InvalidResponse,
    Unavailable,
)


@contextmanager
def _mapped_errors(url: str) -> Iterator[None]:
    """httpx's exceptions as the library's: whether the request may have reached the
    server decides between Unavailable (it did not) and ConnectionLost (it may have)."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        raise Unavailable(f"cannot connect to {url}: {error or type(error).__name__}") from None
    except httpx.TimeoutException as error:
        raise DeadlineExceeded(f"no answer from {url} in time ({type(error).__name__})") from None
    except httpx.TransportError as error:
        raise ConnectionLost(f"connection to {url} failed: {error!r}") from None
    except httpx.HTTPError as error:
        raise InvalidResponse(f"unreadable answer from {url}: {error!r}") from None


def _default_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's headers, asking for uncompressed answers unless they say otherwise:
    httpx offers gzip by default and the server compresses when asked, as Triton does,
    which costs both sides CPU for tensors that barely compress."""
    return {"Accept-Encoding": "identity", **headers}


def _timeout(seconds: float | None, connect: float) -> httpx.Timeout:
    """The call's remaining time for every phase, connecting within at most ``connect``."""
    return httpx.Timeout(seconds, connect=connect if seconds is None else min(connect, seconds))


class HttpRunner:
    """Sends requests over one ``httpx.Client`` and its connection pool."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout: float,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._url = base_url
        self._connect = connect_timeout
        self._client = httpx.Client(
            base_url=base_url, headers=_default_headers(headers), verify=verify
        )

    def send(self, request: HttpRequest, timeout: float | None) -> httpx.Response:
        with _mapped_errors(self._url):
            return self._client.request(
                request.method,
                request.path,
                content=request.content,
                headers=request.headers,
                timeout=_timeout(timeout, self._connect),
            )

    def close(self) -> None:
        self._client.close()


class AsyncHttpRunner:
    """Sends requests over one ``httpx.AsyncClient`` and its connection pool."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout: float,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._url = base_url
        self._connect = connect_timeout
        self._client = httpx.AsyncClient(
            base_url=base_url, headers=_default_headers(headers), verify=verify
        )

    async def send(self, request: HttpRequest, timeout: float | None) -> httpx.Response:
        with _mapped_errors(self._url):
            return await self._client.request(
                request.method,
                request.path,
                content=request.content,
                headers=request.headers,
                timeout=_timeout(timeout, self._connect),
            )

    async def close(self) -> None:
        await self._client.aclose()
