"""Scheduling policy of one model, read once from its ModelConfig."""

from __future__ import annotations

from dataclasses import dataclass

from batchserve.grpc.generated.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How requests of one model are queued and grouped.

    Args:
        max_batch_size: samples per batch; 0 means the model takes no batch axis.
        merge_requests: dynamic batching is on (several requests share a batch).
        preferred_batch_sizes: dispatch at once when a batch reaches one of these.
        max_queue_delay_ns: longest a request waits for company; 0 is greedy.
        max_queue_size: requests queued (all levels) before new ones are refused.
        priority_levels: number of levels, 1 the highest.
        default_priority: level of requests that name none.
        default_timeout_ns: queue timeout of requests that name none; 0 for none.
        allow_timeout_override: requests may ask for a shorter timeout.
    """

    max_batch_size: int
    merge_requests: bool
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    max_queue_size: int = 1024
    priority_levels: int = 1
    default_priority: int = 1
    default_timeout_ns: int = 0
    allow_timeout_override: bool = True

    @classmethod
    def from_config(cls, config: ModelConfig, server_max_queue_size: int) -> BatchPolicy:
        """Triton's fields; a model without dynamic_batching runs each request alone."""
        if not config.HasField("dynamic_batching"):
            return cls(max_batch_size=config.max_batch_size, merge_requests=False,
                       max_queue_size=server_max_queue_size)  # fmt: skip
        batching = config.dynamic_batching
        queue = batching.default_queue_policy
        levels = max(1, batching.priority_levels)
        return cls(
            max_batch_size=config.max_batch_size,
            merge_requests=config.max_batch_size > 0,
            preferred_batch_sizes=tuple(sorted(batching.preferred_batch_size)),
            max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
            max_queue_size=queue.max_queue_size or server_max_queue_size,
            priority_levels=levels,
            default_priority=batching.default_priority_level or levels,
            default_timeout_ns=queue.default_timeout_microseconds * 1000,
            allow_timeout_override=queue.allow_timeout_override
            or not queue.default_timeout_microseconds,
        )
