"""The handshake-deadline watch against a real grpc server's channelz, on a fake clock:
only a connection that started no call and vanished at the deadline is counted."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from batchserve.grpc.connection_watch import HandshakeTimeoutWatch
from batchserve.observability.refusals import Protocol, Reason, Refusals

DEADLINE = 20.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def port() -> Iterator[int]:
    # A deadline far away: core never closes the sockets itself, the test does.
    server = grpc.server(
        futures.ThreadPoolExecutor(1), options=[("grpc.server_handshake_timeout_ms", 600_000)]
    )
    bound = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield bound
    server.stop(None)


def _watch() -> tuple[HandshakeTimeoutWatch, Refusals, Clock]:
    refusals, clock = Refusals(), Clock()
    return HandshakeTimeoutWatch(DEADLINE, refusals, clock), refusals, clock


def _counted(refusals: Refusals) -> int:
    return refusals.snapshot().get((Protocol.GRPC, Reason.HANDSHAKE_TIMEOUT), 0)


def _look_until_listed(watch: HandshakeTimeoutWatch, before: frozenset[int]) -> None:
    """Core accepts a new connection a moment after the client connects (longer on a busy
    machine): look until channelz lists it."""
    for _ in range(100):
        watch.look()
        if watch.tracked - before:
            return
        time.sleep(0.05)
    raise AssertionError("the new connection never showed in channelz")


def _look_until_gone(watch: HandshakeTimeoutWatch, before: frozenset[int]) -> None:
    """Core notices a client's close a moment later; look until channelz has caught up
    (sockets of other servers in this process, listed ``before``, may stay)."""
    for _ in range(50):
        watch.look()
        if watch.tracked <= before:
            return
        time.sleep(0.05)
    raise AssertionError("the closed socket stayed listed")


@pytest.mark.parametrize(
    ("lifetime", "counted"),
    [
        (DEADLINE, 1),
        (DEADLINE + 1.5, 1),
        (DEADLINE - 1.0, 1),
        (DEADLINE - 2.0, 0),  # closed by its client: a look caught it, the next saw it gone
        (DEADLINE + 10, 0),
        (3.0, 0),
    ],
)
def test_a_silent_connection_counts_only_when_it_closes_at_the_deadline(
    port: int, lifetime: float, counted: int
) -> None:
    watch, refusals, clock = _watch()
    watch.look()
    before = watch.tracked
    with socket.create_connection(("127.0.0.1", port)):
        _look_until_listed(watch, before)
    clock.now += lifetime
    _look_until_gone(watch, before)
    assert _counted(refusals) == counted


def test_a_connection_that_made_a_call_is_never_counted(port: int) -> None:
    watch, refusals, clock = _watch()
    watch.look()
    before = watch.tracked
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.RpcError):  # no such method; the stream still started
            channel.unary_unary("/none.None/Call", None, None)(b"", timeout=5)
        watch.look()
    clock.now += DEADLINE
    _look_until_gone(watch, before)
    assert _counted(refusals) == 0


def test_sockets_of_every_server_are_seen_past_the_first_page_of_servers() -> None:
    """channelz lists a hundred servers at a time; a connection to the newest of more than
    that is watched too."""
    servers = []
    try:
        for _ in range(101):
            server = grpc.server(futures.ThreadPoolExecutor(1))
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            servers.append(server)
        watch, _, _ = _watch()
        watch.look()
        before = watch.tracked
        with socket.create_connection(("127.0.0.1", port)):
            _look_until_listed(watch, before)
    finally:
        for server in servers:
            server.stop(None)
