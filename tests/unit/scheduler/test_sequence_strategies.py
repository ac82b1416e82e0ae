"""Triton's two sequence strategies as batching policy: candidate slots per instance, and
when a batch of steps goes (queue delay, preferred sizes, minimum slot utilization)."""

from __future__ import annotations

import pytest
from batchserve.models.model_config import parse_pbtxt
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.sequences import candidate_slots

BASE = 'name: "s" max_batch_size: 8 input [{ name: "x" data_type: TYPE_INT32 dims: [1] }] '


def _policy(strategy: str) -> BatchPolicy:
    config = parse_pbtxt(BASE + f"sequence_batching {{ {strategy} }}")
    return BatchPolicy.from_config(config, server_max_queue_size=64)


def test_direct_ignores_its_delay_without_a_slot_utilization() -> None:
    """Triton: 'max_queue_delay_microseconds will be ignored unless minimum_slot_utilization
    is set to a non-zero value'."""
    policy = _policy("direct { max_queue_delay_microseconds: 5000 }")
    assert (policy.max_queue_delay_ns, policy.preferred_batch_sizes) == (0, ())


def test_direct_with_a_slot_utilization_waits_until_that_share_of_slots_is_ready() -> None:
    policy = _policy("direct { max_queue_delay_microseconds: 5000 minimum_slot_utilization: 0.3 }")
    assert policy.max_queue_delay_ns == 5_000_000
    assert policy.preferred_batch_sizes == (3, 4, 5, 6, 7, 8)  # ceil(0.3 * 8) ready slots


def test_oldest_keeps_its_delay_and_preferred_sizes() -> None:
    policy = _policy("oldest { max_queue_delay_microseconds: 700 preferred_batch_size: [6, 2] }")
    assert (policy.max_queue_delay_ns, policy.preferred_batch_sizes) == (700_000, (2, 6))


@pytest.mark.parametrize(
    ("strategy", "slots"),
    [
        ("", 8),
        ("direct { }", 8),
        ("oldest { max_candidate_sequences: 100 }", 100),
        ("oldest { }", 8),  # unset: one per batch slot, as Triton counts
    ],
)
def test_candidate_slots_per_instance(strategy: str, slots: int) -> None:
    config = parse_pbtxt(BASE + f"sequence_batching {{ {strategy} }}")
    assert candidate_slots(config) == slots
