"""Whether a client is on this host: only such a client can share memory with the server.

Addresses come as the transports give them: an HTTP client's host (``"127.0.0.1"``,
``"::1"``) or a gRPC peer (``"ipv4:127.0.0.1:52311"``, ``"ipv6:[::1]:52311"``,
``"unix:/run/sock"``).
"""

from __future__ import annotations

import ipaddress


def _host(peer: str) -> str:
    """The address part of a gRPC peer string, or ``peer`` itself for a bare host."""
    for scheme in ("ipv4:", "ipv6:"):
        if peer.startswith(scheme):
            rest = peer[len(scheme) :]
            if rest.startswith("["):
                return rest[1 : rest.find("]")]
            return rest.rsplit(":", 1)[0]
    return peer


def is_local(peer: str | None) -> bool:
    """True for loopback addresses (IPv4-mapped ones included) and Unix sockets."""
    if not peer:
        return False
    if peer.startswith("unix:") or peer.startswith("unix-abstract:"):
        return True
    try:
        address = ipaddress.ip_address(_host(peer))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
