"""Addresses written as ``host:port``."""

from __future__ import annotations


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 literal in brackets (``[::1]:8001``): gRPC reads ``::1:8001``
    as a name it cannot resolve, so ``--host ::`` (an IPv6 cluster's pod) used to stop the
    start."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
