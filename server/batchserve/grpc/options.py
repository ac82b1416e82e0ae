"""grpc core's server channel arguments: message sizes, connection time limits, and the
backlog limits that would otherwise refuse calls where nothing can count them.

Each argument name was checked against grpcio 1.85 by experiment over raw sockets, not
taken from documentation; the comments say what was seen.
"""

from __future__ import annotations

from batchserve.core.settings import INT32_MAX, Settings

Option = tuple[str, int]
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}
"""Triton's ``--grpc-infer-response-compression-level`` words, as grpc core's levels."""
MIN_QUEUED_CALLS = 10_000
"""Calls core queues before it drops any, whatever the limit on calls in flight: about
110 MiB of them, at the 11 KiB each measured under rapid reset."""


def server_options(settings: Settings, reuse_port: bool = False) -> list[Option]:
    """The grpc.aio server's channel arguments for ``settings``; ``reuse_port`` for the
    workers that share one port (``--workers``), else a second server on it fails."""
    return [
        ("grpc.max_receive_message_length", settings.max_binary_body_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", int(reuse_port)),
        # seen: a response of 2,161 bytes went as 51 compressed bytes at level 1 (gzip
        # accepted), uncompressed at 0
        (
            "grpc.default_compression_level",
            COMPRESSION_LEVELS[settings.grpc_infer_response_compression_level],
        ),
        *connection_limits(settings),
        *ping_policy(settings),
        *connection_age(settings),
        *bounded_backlog(settings),
    ]


def connection_limits(settings: Settings) -> list[Option]:
    """Close connections that hold a descriptor and do nothing.

    The handshake deadline runs until the client's first HTTP/2 SETTINGS frame: a silent
    connection and one sending its preface a byte a second both get GOAWAY ("Did not
    receive HTTP/2 settings before handshake timeout") and are closed when it passes.
    An established connection with no call in flight gets GOAWAY ("connection idle") after
    the idle limit; clients reconnect on their next call without failing it. Keepalive
    pings drop a peer that stops answering while a call is open; grpc 1.85 times a ping
    out after ``grpc.http2.ping_timeout_ms`` (``grpc.keepalive_timeout_ms`` alone left an
    unanswered ping waiting its 60 s default), so both are set.
    """
    timeout = settings.grpc_keepalive_timeout_ms
    return [
        ("grpc.server_handshake_timeout_ms", settings.grpc_handshake_timeout_ms),
        ("grpc.max_connection_idle_ms", settings.grpc_max_connection_idle_ms),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", timeout),
        ("grpc.http2.ping_timeout_ms", timeout),
    ]


def ping_policy(settings: Settings) -> list[Option]:
    """Triton's keepalive flags for pings, as the grpc core arguments Triton passes them to.

    A client pinging with no call open, or more often than the minimum interval, earns a
    strike for each ping (with no call open and ``keepalive_permit_without_calls`` off, any
    second ping within two hours does); past ``max_ping_strikes`` (0: no limit) it gets
    GOAWAY ENHANCE_YOUR_CALM "too_many_pings". ``max_pings_without_data`` bounds the pings
    this side sends while no data flows (0: no limit).
    """
    return [
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
    ]


def connection_age(settings: Settings) -> list[Option]:
    """Close connections after an age, so that clients resolve the address again and spread
    over pods added since they connected (a gRPC channel otherwise keeps its connection for
    as long as it is used). grpc core sends GOAWAY at the age (give or take 10 %), lets calls
    in flight finish for the grace period, then closes; clients reconnect for their next
    call. Neither is set unless asked for: grpc core's default is no limit.
    """
    options: list[Option] = []
    if settings.grpc_max_connection_age_ms is not None:
        options.append(("grpc.max_connection_age_ms", settings.grpc_max_connection_age_ms))
    if settings.grpc_max_connection_age_grace_ms is not None:
        grace = settings.grpc_max_connection_age_grace_ms
        options.append(("grpc.max_connection_age_grace_ms", grace))
    return options


def bounded_backlog(settings: Settings) -> list[Option]:
    """Let every call the application could take reach it, and no more than that wait.

    Core queues calls that grpc.aio has not yet asked for. By default, past 1000 queued it
    drops new ones at random, past 3000 all of them, and after 30 s in the queue it drops the
    oldest: each as CANCELLED, before any handler runs, so no counter could see it (a burst
    of 2000 calls on one channel lost about 9 % that way). Unbounded, the queue grew with
    every call a client opened faster than the loop took them: one connection opening and
    resetting streams (HTTP/2 "rapid reset") had the server at 4.1 GB after 15 s, none of
    it returned. So core queues as many calls as may be in flight
    (``--grpc-max-concurrent-calls``, and never fewer than MIN_QUEUED_CALLS: tied to a limit
    of 64, a burst of 3000 calls on one channel had 1940 cancelled), drops at random up to
    twice that, and holds no more; the limit on calls in flight and the model queues refuse,
    with a status and a count, what reaches the application. One connection may have as many
    streams open (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS; core's default is no limit):
    past it core refuses a stream at the cost of a frame, uncounted, so it is no lower than
    what the call limit would refuse anyway. At 1000, a burst of 3000 calls on one grpc
    channel had 1150 refused by core that way.
    """
    calls = max(settings.grpc_max_concurrent_calls, MIN_QUEUED_CALLS)
    return [
        ("grpc.max_concurrent_streams", calls),
        ("grpc.server.max_pending_requests", calls),
        ("grpc.server.max_pending_requests_hard_limit", min(2 * calls, INT32_MAX)),
        ("grpc.server_max_unrequested_time_in_server", INT32_MAX),
    ]
