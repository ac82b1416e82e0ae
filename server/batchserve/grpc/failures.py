"""What a failed gRPC call or stream request leaves behind, the same wherever it failed: a
refusal counted, an unexpected error (INTERNAL) logged once at ERROR with its traceback."""

from __future__ import annotations

import logging

import grpc

from batchserve.core.errors import InternalRefusal, grpc_status
from batchserve.observability.refusals import REFUSALS, Protocol

logger = logging.getLogger(__name__)


def report_failure(error: Exception) -> grpc.StatusCode:
    """Count and log ``error``; its status, for the answer."""
    REFUSALS.count_error(Protocol.GRPC, error)
    status = grpc_status(error)
    if status is grpc.StatusCode.INTERNAL and not isinstance(error, InternalRefusal):
        logger.error("unexpected error", exc_info=error)
    return status
