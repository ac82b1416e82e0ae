"""A valid request made a model version's work, and its answer counted: what the dataplane,
the model-owning process's end of a worker, and an ensemble's steps all do, once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from batchserve.core.errors import InvalidArgument
from batchserve.core.validation import ValidRequest
from batchserve.models.model_table import ServedVersion
from batchserve.observability.logs import bind_request
from batchserve.scheduler.padding import check_lengths, check_steps
from batchserve.scheduler.work import WorkItem


def work_item(
    served: ServedVersion,
    valid: ValidRequest,
    requested_priority: int,
    timeout_us: int,
    now: int,
    is_cancelled: Callable[[], bool] | None = None,
) -> WorkItem:
    """A valid request as the batcher queues it, under the model's batch cap, priority
    levels and queue timeout."""
    policy = served.batcher.policy
    if policy.max_batch_size and valid.batch_size > policy.max_batch_size:
        raise InvalidArgument(
            f"batch of {valid.batch_size} samples exceeds the batch cap of model "
            f"'{served.name}' ({policy.max_batch_size}, derived from its memory budget); "
            "send smaller batches"
        )
    check_lengths(policy, valid.inputs)
    if policy.max_batch_steps:  # (the lenders are listed only for such a model)
        check_steps(policy, served.name, valid.inputs, max(1, valid.batch_size),
                    served.batcher.lenders())  # fmt: skip
    # Triton's rule (infer_request.cc): 0, or past the model's levels, is the default
    in_levels = 1 <= requested_priority <= policy.priority_levels
    priority = requested_priority if in_levels else policy.default_priority
    level = policy.queue_policy(priority)
    timeout_ns = level.timeout_ns
    if timeout_us and (level.allow_timeout_override or not timeout_ns):
        requested = timeout_us * 1000
        timeout_ns = min(timeout_ns, requested) if timeout_ns else requested
    timeout_at = now + timeout_ns if timeout_ns else None
    return WorkItem(
        inputs=valid.inputs,
        batch_size=valid.batch_size,
        output_names=valid.output_names,
        priority=priority,
        enqueued_ns=now,
        deadline_ns=None if level.delays else timeout_at,
        future=asyncio.get_running_loop().create_future(),
        is_cancelled=is_cancelled,
        delay_at_ns=timeout_at if level.delays else None,
    )


def record_success(
    served: ServedVersion, started: int, item: WorkItem, protocol: str, count: int = 1
) -> None:
    """``count`` requests answered by ``item`` (more than one: a worker's group, whose
    members share every timing)."""
    finished = time.monotonic_ns()
    served.stats.record_request(
        True, finished - started, item.dispatched_ns - started, protocol=protocol,
        count=count,
    )  # fmt: skip
    if item.planned_finish_ns:  # (with an objective) how late past its batch's plan
        served.batcher.answered(item, finished, count)


def record_failure(
    served: ServedVersion,
    started: int,
    error: BaseException,
    protocol: str,
    request_id: str,
    count: int = 1,
) -> None:
    served.stats.record_request(False, time.monotonic_ns() - started, 0, error, protocol, count)
    bind_request(served.name, request_id)
