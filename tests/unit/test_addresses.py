"""host:port as gRPC reads it."""

from __future__ import annotations

import pytest
from batchserve.core.addresses import host_port


@pytest.mark.parametrize(
    ("host", "written"),
    [
        ("127.0.0.1", "127.0.0.1:8001"),
        ("0.0.0.0", "0.0.0.0:8001"),
        ("localhost", "localhost:8001"),
        ("::", "[::]:8001"),
        ("::1", "[::1]:8001"),
        ("fd00::2", "[fd00::2]:8001"),
        ("[::1]", "[::1]:8001"),
    ],
)
def test_an_ipv6_literal_is_bracketed(host: str, written: str) -> None:
    assert host_port(host, 8001) == written
