"""The open-files limit raised to its hard ceiling: every connection holds a descriptor.

systemd, and Docker from version 25, start a process with a soft limit of 1024 descriptors
under a hard one of 524288. The soft one stays low for programs that still wait with
``select()``, which cannot watch a descriptor above 1023; this server waits with epoll
(uvloop, grpc core) and never with ``select()``. At a soft limit of 256, 900 idle
connections refused every new one: HTTP's silently (libuv accepts and closes at once while
out of descriptors), gRPC's only at its deadline, with a line a second on stderr. So, as
Go's runtime does for every program since 1.19, ``serve`` raises the soft limit to the hard
one before it starts anything; the fork server and the workers inherit it. It stops at
``MOST`` (Linux's default ceiling): a hard limit of about 2**30 (systemd's ``infinity``) would
make a C library without ``close_range`` close that many descriptors one by one wherever a
process closes all it does not know (the fork server does, once). A hard limit that is
unlimited (macOS) or a platform without ``resource`` (Windows) leaves it as it is.
"""

from __future__ import annotations

import contextlib

MOST = 1 << 20


def raise_to_hard_limit() -> None:
    """Raise the soft open-files limit to the hard one (at most ``MOST``), where both can be
    read."""
    try:
        import resource
    except ImportError:  # Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, MOST)
    if hard != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def soft_limit() -> int | None:
    """The open-files limit in force (None where there is none to read)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
