"""What a failed gRPC call leaves in the log: the server's own faults with their traceback,
a refusal Triton answers INTERNAL (a load's file name past NAME_MAX) without one."""

from __future__ import annotations

import logging

import grpc
import pytest
from batchserve.core.errors import BackendError
from batchserve.grpc.failures import report_failure
from batchserve.models.load_override import NameTooLong


def test_a_refusal_answered_internal_is_not_logged_as_the_servers_fault(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="batchserve.grpc"):
        assert report_failure(NameTooLong("file name too long")) is grpc.StatusCode.INTERNAL
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    with caplog.at_level(logging.DEBUG, logger="batchserve.grpc"):
        assert report_failure(BackendError("the runtime failed")) is grpc.StatusCode.INTERNAL
    [record] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.getMessage() == "unexpected error"
    assert record.exc_info is not None
