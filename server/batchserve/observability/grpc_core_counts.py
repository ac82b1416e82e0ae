"""What grpc core itself counted of the server's calls, read from channelz at scrape time.

grpc core refuses some calls before any Python code runs: a message over
``--max-binary-body-bytes`` (RESOURCE_EXHAUSTED), a call caught by shutdown. The application
never sees them, so ``batchserve_refusals_total`` cannot count them; core's channelz
counters do (calls started, succeeded, failed), and a scrape reads them. They are read as
grpcio-channelz's own servicer reads them, from grpcio's JSON rendering, without serving the
channelz service.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from grpc._cython import cygrpc  # type: ignore[attr-defined]  # no stubs for the extension

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoreCallCounts:
    """Calls of every gRPC server in the process, as grpc core counted them."""

    started: int
    succeeded: int
    failed: int


def read_core_call_counts() -> CoreCallCounts | None:
    """The counts now; None (logged) if this grpcio cannot give them."""
    try:
        servers = json.loads(cygrpc.channelz_get_servers(0)).get("server", [])
    except (AttributeError, ValueError) as exc:
        logger.debug("grpc core call counts unavailable", extra={"reason": str(exc)})
        return None
    totals = {"callsStarted": 0, "callsSucceeded": 0, "callsFailed": 0}
    for server in servers:
        data = server.get("data", {})
        for key in totals:
            totals[key] += int(data.get(key, 0))  # channelz writes int64 as strings
    return CoreCallCounts(totals["callsStarted"], totals["callsSucceeded"], totals["callsFailed"])
