"""Requests that travel to the model-owning process together.

Requests a worker decodes in one pass of its event loop or the next, for the same model
version, with the same input layout but for the batch axis, the same outputs and the same
options, are sent as one: their inputs written back to back in the arena, one frame, one
work item there. That process's cost is then paid per group, not per request, while every
request is still counted on its own. A group closes at the end of the pass after the one
that opened it, or when the next request would take it past the model's batch cap. The pass
between lets the loop poll its sockets once more (without waiting: callbacks are ready), so
requests already there join the group: over HTTP a burst of requests reaches the groups
over two passes or more, and groups half as large again cost the model-owning process less
a request (``bench/NOTES.md``, forty-second round). Nothing waits for a request that has
not arrived. And while that process has not yet read the worker's last request frame,
groups stay open until it has (it counts its reads where the worker can see them,
``read_mark``). An idle server so sends each request at once, and a busy one (whose
requests would wait in the socket anyway) sends larger groups: its cost per request falls
as its load rises, whatever the protocol spreads arrivals over passes. A group whose
clients have all left is cancelled there, as a lone request is; one whose clients left in
part still runs, and those answers are dropped. A group that fails alone in a way a
request's own inputs can cause (a poisoned one) is sent again member by member, so that only
the members that fail on their own get the error, as they would from one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from batchserve.dataplane.handoff.frames import Frame


class GroupKey(NamedTuple):
    """What requests of one group share."""

    model: str
    version: str
    generation: int
    protocol: str
    priority: int
    timeout_us: int
    outputs: tuple[str, ...]
    layout: tuple[tuple[str, str, tuple[int, ...]], ...]
    """Each input's name, wire datatype and shape past the batch axis, by name."""


@dataclass(frozen=True, slots=True)
class Share:
    """A request's part of its group's answer: rows ``start`` to ``start + count`` of
    every output (or the group's error frame)."""

    frame: Frame
    outputs: dict[str, np.ndarray]
    start: int
    count: int

    def output(self, name: str) -> np.ndarray:
        return self.outputs[name][self.start : self.start + self.count]


@dataclass(slots=True)
class Member:
    arrays: dict[str, np.ndarray]
    batch_size: int
    future: asyncio.Future[Share]
    group: int = -1
    """The id its group was sent under (-1 until then)."""


Send = Callable[[GroupKey, list[Member]], None]


class OpenGroups:
    """Groups being filled: in this pass of the event loop, or for as long as ``held``."""

    def __init__(
        self, send: Send, loop: asyncio.AbstractEventLoop, held: Callable[[], bool]
    ) -> None:
        self._send = send
        self._loop = loop
        self._held = held
        self._open: dict[GroupKey, tuple[list[Member], int]] = {}
        self._closing = False
        """A close is scheduled: for the end of the next pass (``_next_pass``) or of this one
        (``release``)."""

    def add(self, key: GroupKey, member: Member, cap: int) -> None:
        members, samples = self._open.get(key, ([], 0))
        if members and samples + member.batch_size > cap:
            self._send(key, members)  # full: it goes now, the newcomer starts the next
            members, samples = [], 0
        members.append(member)
        self._open[key] = (members, samples + member.batch_size)
        if not self._closing:
            self._closing = True
            self._loop.call_soon(self._next_pass)

    def _next_pass(self) -> None:
        """Let the loop poll its sockets once more before the groups close."""
        self._loop.call_soon(self.close_all)

    def close_all(self) -> None:
        """Send every open group (at the end of the pass after the one that opened them),
        unless held: then ``release`` sends them."""
        self._closing = False
        if self._held():
            return
        groups, self._open = self._open, {}
        for key, (members, _) in groups.items():
            self._send(key, members)

    def release(self) -> None:
        """No longer held: the open groups go at the end of this pass."""
        if self._open and not self._closing:
            self._closing = True
            self._loop.call_soon(self.close_all)


def split(frame: Frame, outputs: dict[str, np.ndarray], members: list[Member]) -> None:
    """Give each member still waiting its rows of the group's answer."""
    start = 0
    for member in members:
        if not member.future.done():
            member.future.set_result(Share(frame, outputs, start, member.batch_size))
        start += member.batch_size
