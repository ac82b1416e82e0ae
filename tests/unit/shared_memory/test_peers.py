"""Telling a client on this host from a remote one, from the addresses the transports give."""

from __future__ import annotations

import pytest
from batchserve.dataplane.shared_memory.peers import is_local


@pytest.mark.parametrize(
    "peer",
    ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "ipv4:127.0.0.1:52311",
     "ipv6:[::1]:52311", "ipv6:[::ffff:127.0.0.1]:6", "unix:/run/batchserve.sock",
     "unix-abstract:batchserve"],
)  # fmt: skip
def test_loopback_and_unix_sockets_are_local(peer: str) -> None:
    assert is_local(peer)


@pytest.mark.parametrize(
    "peer",
    [None, "", "192.0.2.7", "10.0.0.1", "fd00::2", "::ffff:192.0.2.7", "ipv4:192.0.2.7:80",
     "ipv6:[fd00::2]:80", "ipv4:127.0.0.1.evil:80", "localhost", "127.0.0.1:80", "garbage"],
)  # fmt: skip
def test_every_other_address_is_not(peer: str | None) -> None:
    assert not is_local(peer)
