"""The gRPC settings reach grpc core as the channel arguments the experiments proved, and
the limit on calls in flight counts what it refuses."""

from __future__ import annotations

import grpc
import pytest
from batchserve.core.settings import INT32_MAX, Settings
from batchserve.grpc.call_limit import CallLimit
from batchserve.grpc.options import MIN_QUEUED_CALLS, server_options
from batchserve.observability.refusals import REFUSALS, Protocol, Reason


def test_each_connection_limit_reaches_its_channel_argument() -> None:
    settings = Settings(
        grpc_handshake_timeout_ms=1_001,
        grpc_max_connection_idle_ms=1_002,
        grpc_keepalive_time_ms=1_003,
        grpc_keepalive_timeout_ms=1_004,
    )
    options = dict(server_options(settings))
    assert options["grpc.server_handshake_timeout_ms"] == 1_001
    assert options["grpc.max_connection_idle_ms"] == 1_002
    assert options["grpc.keepalive_time_ms"] == 1_003
    # grpc 1.85 times a ping out by ping_timeout_ms: keepalive_timeout_ms alone did nothing.
    assert options["grpc.keepalive_timeout_ms"] == options["grpc.http2.ping_timeout_ms"] == 1_004


@pytest.mark.parametrize(
    ("calls", "queued"), [(64, MIN_QUEUED_CALLS), (50_000, 50_000), (INT32_MAX, INT32_MAX)]
)
def test_core_queues_as_many_calls_as_may_be_in_flight_and_no_more(calls: int, queued: int) -> None:
    """Core drops nothing queued within the limit on calls in flight (or MIN_QUEUED_CALLS),
    drops at random up to twice it, and never holds more (unbounded, a rapid-reset client
    grew it to 4.1 GB)."""
    options = dict(server_options(Settings(grpc_max_concurrent_calls=calls)))
    assert options["grpc.server.max_pending_requests"] == queued
    assert options["grpc.server.max_pending_requests_hard_limit"] == min(2 * queued, INT32_MAX)
    assert options["grpc.server_max_unrequested_time_in_server"] == INT32_MAX
    assert options["grpc.max_concurrent_streams"] == queued


def _refused() -> int:
    return REFUSALS.snapshot().get((Protocol.GRPC, Reason.TOO_MANY_CALLS), 0)


def test_a_call_over_the_limit_is_refused_and_counted_until_one_leaves() -> None:
    calls = CallLimit(2)
    before = _refused()
    assert calls.enter()
    assert calls.enter()
    assert not calls.enter()
    assert _refused() - before == 1
    calls.leave()
    assert calls.enter()
    assert calls.active == 2
    code, message = calls.refusal
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "limit 2" in message
