"""Ports several processes serve together (``SO_REUSEPORT``): the kernel spreads new
connections over the workers listening on them."""

from __future__ import annotations

import socket

from batchserve.core.addresses import host_port
from batchserve.core.errors import CannotStart

BACKLOG = 2048


def reuse_port_socket(serves: str, host: str, port: int, listening: bool) -> socket.socket:
    """A TCP socket on ``host:port`` that other processes of this user may bind too;
    ``serves`` names the protocol in the error when the port cannot be had.

    Not listening, it only holds the port (and learns it when ``port`` is 0): the kernel
    gives connections to the listening sockets alone.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        if listening:
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise CannotStart(
            f"cannot serve {serves} on {host_port(host, port)}: {exc.strerror or exc}"
        ) from None
    return sock


def ensure_unshared(serves: str, host: str, port: int, flag: str) -> None:
    """CannotStart when another process holds ``host:port``, even one that lets others
    share it: a bind without ``SO_REUSEPORT`` fails then. Without this check a second
    server started with several workers would silently take half of the first's
    connections, where Triton refuses to start unless ``flag`` (its ``--reuse-*-port``)
    says to share."""
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CannotStart(
                f"cannot serve {serves} on {host_port(host, port)}: {exc.strerror or exc} "
                f"(another process holds it; {flag} true shares it with that process)"
            ) from None


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
