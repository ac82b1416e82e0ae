"""Cancelling an inference whose client went away, told by the connection itself.

Watching ``receive()`` for ``http.disconnect`` takes a task per request, created, woken
and cancelled: about 8 % of the event loop's time at concurrency 32 (bench/NOTES.md). The
server's own protocol instead calls the request in flight back when its connection is
lost. Under any other ASGI server (tests, embedding) ``until_disconnect`` watches
``receive()`` as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_T = TypeVar("_T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_NOTICE = "batchserve_disconnect_notice"
"""The attribute of uvicorn's request cycle that holds its ``DisconnectNotice``."""


class ClientDisconnected(ClientDisconnect):
    """The client went away before its answer was ready. Starlette's kind, so that a route
    that does not catch it ends as one whose client left while its body was read: no
    answer sent, nothing logged."""


class DisconnectNotice:
    """Whether a request's connection was lost before its response completed, and whom to
    tell when it is."""

    __slots__ = ("callback", "lost")

    def __init__(self) -> None:
        self.lost = False
        self.callback: Callable[[], object] | None = None

    def connection_lost(self) -> None:
        self.lost = True
        if self.callback is not None:
            self.callback()


def notice_for(receive: Receive) -> DisconnectNotice | None:
    """The notice of the request ``receive`` belongs to, when the server keeps one."""
    notice = getattr(getattr(receive, "__self__", None), _NOTICE, None)
    return notice if isinstance(notice, DisconnectNotice) else None


class DisconnectNoticeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, giving each request cycle a ``DisconnectNotice``."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        setattr(self.cycle, _NOTICE, DisconnectNotice())

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # lost before its response completed
            notice = getattr(cycle, _NOTICE, None)
            if isinstance(notice, DisconnectNotice):
                notice.connection_lost()


async def until_disconnect(work: Awaitable[_T], receive: Receive) -> _T:
    """Await ``work``, cancelling it if the client disconnects first (freeing its place);
    then raise ClientDisconnected."""
    notice = notice_for(receive)
    if notice is None:
        return await _watching(work, receive)
    if notice.lost:
        _close(work)
        raise ClientDisconnected
    task = asyncio.current_task()
    assert task is not None
    notice.callback = task.cancel
    try:
        return await work
    except asyncio.CancelledError:
        if notice.lost:
            raise ClientDisconnected from None
        raise
    finally:
        notice.callback = None


async def _watching(work: Awaitable[_T], receive: Receive) -> _T:
    task = asyncio.current_task()
    assert task is not None
    waiting = True

    async def watch() -> None:
        message = await receive()
        if message["type"] == "http.disconnect" and waiting:
            task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ClientDisconnected from None
        raise
    finally:
        waiting = False
        watcher.cancel()


def _close(work: Awaitable[Any]) -> None:
    """A coroutine that will never be awaited, closed so that Python does not warn."""
    close = getattr(work, "close", None)
    if close is not None:
        close()
