"""What crosses the process boundary besides tensors: errors and the workers' counts."""

from __future__ import annotations

import pytest
from batchserve.core import errors
from batchserve.core.errors import http_status
from batchserve.dataplane.handoff.errors import error_frame, error_from
from batchserve.observability.grpc_core_counts import CoreCallCounts
from batchserve.observability.refusals import Protocol, Reason, Refusals
from batchserve.rest.compression import UnsupportedEncoding
from batchserve.runtime.worker_counts import WorkerCounts, counts_frame


@pytest.mark.parametrize(
    "error",
    [errors.InvalidArgument("bad"), errors.Overloaded("full"), errors.NotFound("gone"),
     errors.DeadlineExceeded("late"), errors.PayloadTooLarge("big"),
     errors.ControlDisabled("off"), errors.OutOfMemory("oom")],
)  # fmt: skip
def test_an_error_comes_back_as_its_own_class_with_its_message(
    error: errors.BatchserveError,
) -> None:
    again = error_from(*error_frame(error))
    assert type(again) is type(error)
    assert again.message == error.message
    assert http_status(again) == http_status(error)


def test_an_error_class_from_outside_core_comes_back_as_its_core_parent() -> None:
    again = error_from(*error_frame(UnsupportedEncoding("no zstd")))
    assert type(again) is errors.InvalidArgument
    assert again.message == "no zstd"


def test_an_unexpected_error_comes_back_internal_without_its_details() -> None:
    again = error_from(*error_frame(KeyError("secret")))
    assert type(again) is errors.Internal
    assert "secret" not in again.message


def _worker(refusals: dict[tuple[Protocol, Reason], int], core: tuple[int, int, int]) -> tuple:
    counted = Refusals()
    for key, count in refusals.items():
        for _ in range(count):
            counted.count(*key)
    return counts_frame(counted, CoreCallCounts(*core))


def test_the_totals_add_every_worker_and_keep_a_gone_workers_counts() -> None:
    own = Refusals()
    own.count(Protocol.HTTP, Reason.OVERLOADED)
    counts = WorkerCounts(own)
    body = (Protocol.HTTP, Reason.BODY_TOO_LARGE)
    counts.update(0, _worker({body: 2}, (10, 9, 1)))
    counts.update(1, _worker({body: 1, (Protocol.GRPC, Reason.TOO_MANY_CALLS): 4}, (5, 5, 0)))
    counts.update(0, _worker({body: 3}, (12, 11, 1)))  # a later report replaces the earlier
    snapshot = counts.snapshot()
    assert snapshot[body] == 4
    assert snapshot[(Protocol.HTTP, Reason.OVERLOADED)] == 1
    assert snapshot[(Protocol.GRPC, Reason.TOO_MANY_CALLS)] == 4
    assert counts.grpc_core() == CoreCallCounts(17, 16, 1)
    counts.retire(0)
    counts.update(0, _worker({body: 1}, (1, 1, 0)))  # its replacement starts from zero
    assert counts.snapshot()[body] == 5
    assert counts.grpc_core() == CoreCallCounts(18, 17, 1)


def test_the_memory_held_is_the_live_workers_latest_and_nothing_of_a_gone_one() -> None:
    counts = WorkerCounts(Refusals())
    nothing = Refusals()
    counts.update(0, counts_frame(nothing, None, held=16 << 20))
    counts.update(1, counts_frame(nothing, None, held=4 << 20))
    counts.update(0, counts_frame(nothing, None, asked=3, held=1 << 20))  # the latest counts
    assert counts.request_memory_held() == 5 << 20
    counts.retire(1)  # a gauge, not a counter: what a gone worker held is free
    assert counts.request_memory_held() == 1 << 20
