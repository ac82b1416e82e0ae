"""Counts the connections grpc core closes at its handshake deadline.

Core closes a connection whose client has not finished the HTTP/2 handshake within
``--grpc-handshake-timeout`` (a silent socket, a preface trickled a byte at a time) without
telling the application, and keeps no counter of it. Channelz does list every open server
socket from its accept on, with the streams it started, so a watch that looks once a second
sees such a socket appear, start no call and vanish at the deadline; each one is counted in
``batchserve_refusals_total{protocol="grpc",reason="handshake_timeout"}``. A connection the
client closes itself before the deadline, or one that ever started a call, is not counted.
On a TLS port channelz lists a connection only once its TLS handshake is done, so one that
never finishes TLS is closed at the deadline all the same but escapes the count.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from grpc._cython import cygrpc  # type: ignore[attr-defined]  # no stubs for the extension

from batchserve.observability.refusals import REFUSALS, Protocol, Reason, Refusals

logger = logging.getLogger(__name__)

WATCH_INTERVAL_SECONDS = 1.0
LOOK_SLACK_SECONDS = 0.5
"""How late a look may come (a busy event loop) or channelz may list a change, past the
interval, for a lifetime still to match the deadline."""
PAGE_SIZE = 1000


@dataclass(slots=True)
class _Seen:
    first_seen: float
    started_a_call: bool = False


class HandshakeTimeoutWatch:
    """Tracks each server socket from its first sighting to its disappearance."""

    def __init__(
        self,
        handshake_timeout_seconds: float,
        refusals: Refusals = REFUSALS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deadline = handshake_timeout_seconds
        self._refusals = refusals
        self._clock = clock
        self._sockets: dict[int, _Seen] = {}

    @property
    def tracked(self) -> frozenset[int]:
        """The channelz ids of the sockets open at the last look."""
        return frozenset(self._sockets)

    def look(self) -> None:
        """One look at the sockets: note the new ones, count those closed at the deadline."""
        now = self._clock()
        current = set(_server_socket_ids())
        for socket_id in current - self._sockets.keys():
            self._sockets[socket_id] = _Seen(now)
        for socket_id, seen in self._sockets.items():
            if socket_id in current and not seen.started_a_call:
                seen.started_a_call = _streams_started(socket_id) > 0
        for socket_id in self._sockets.keys() - current:
            seen = self._sockets.pop(socket_id)
            if not seen.started_a_call and self._closed_at_deadline(now - seen.first_seen):
                self._refusals.count(Protocol.GRPC, Reason.HANDSHAKE_TIMEOUT)

    def _closed_at_deadline(self, lifetime_seen: float) -> bool:
        """Whether a lifetime seen matches the deadline. The looks that saw a socket appear
        and vanish each came up to an interval after the event, so what they saw is within
        one interval of its lifetime, either way. Two intervals let a connection its client
        closed at once be counted whenever one look caught it open: seen for one interval,
        within two of a 3 s deadline (an integration test saw it: four counted for three)."""
        return abs(lifetime_seen - self._deadline) <= WATCH_INTERVAL_SECONDS + LOOK_SLACK_SECONDS

    async def run(self) -> None:
        """Look once a second until cancelled; a grpcio without channelz disables the watch."""
        while True:
            try:
                self.look()
            except AttributeError as exc:
                logger.warning(
                    "gRPC handshake timeouts will not be counted", extra={"reason": repr(exc)}
                )
                return
            await asyncio.sleep(WATCH_INTERVAL_SECONDS)


def _server_socket_ids() -> Iterator[int]:
    """Every open socket of every gRPC server in the process, page by page."""
    for server_id in _server_ids():
        start = 0
        while True:
            try:
                page = json.loads(cygrpc.channelz_get_server_sockets(server_id, start, PAGE_SIZE))
            except ValueError:  # the server stopped since it was listed: on to the next
                break
            refs = page.get("socketRef", [])
            ids = [int(ref["socketId"]) for ref in refs]
            yield from ids
            if page.get("end", False) or not ids:
                break
            start = max(ids) + 1


def _server_ids() -> Iterator[int]:
    """Every gRPC server in the process, page by page (channelz lists a hundred at a time)."""
    start = 0
    while True:
        page = json.loads(cygrpc.channelz_get_servers(start))
        ids = [int(server["ref"]["serverId"]) for server in page.get("server", [])]
        yield from ids
        if page.get("end", False) or not ids:
            return
        start = max(ids) + 1


def _streams_started(socket_id: int) -> int:
    """Streams the socket has started; 0 if it closed since it was listed."""
    try:
        found = json.loads(cygrpc.channelz_get_socket(socket_id))
    except ValueError:  # grpcio raises ValueError for a socket id it no longer knows
        return 0
    return int(found["socket"]["data"].get("streamsStarted", 0))
