"""What the batcher reads from config.pbtxt beyond Triton's basic fields."""

from __future__ import annotations

from batchserve.models.model_config import parse_pbtxt
from batchserve.scheduler.policy import BatchPolicy

CHAR_LSTM = """
name: "char_lstm" max_batch_size: 64
input [{ name: "tokens" data_type: TYPE_INT64 dims: [-1] },
       { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
output [{ name: "next_char_logits" data_type: TYPE_FP32 dims: [98] }]
dynamic_batching { max_queue_delay_microseconds: 2000 preserve_ordering: true }
batchserve { sequence_length_input: "lengths" }
"""


def test_a_sequence_model_groups_on_its_ragged_inputs_only() -> None:
    policy = BatchPolicy.from_config(parse_pbtxt(CHAR_LSTM), server_max_queue_size=8)
    assert policy.sequence_inputs == (("tokens", 1),)
    assert policy.sequence_outputs == ()  # the logits have no sequence axis: nothing to cut
    assert policy.preserve_ordering
    assert policy.aging_ns == 10 * 2_000_000


def test_outputs_with_a_dynamic_axis_are_cut_back() -> None:
    config = parse_pbtxt(CHAR_LSTM)
    config.output[0].ClearField("dims")
    config.output[0].dims.extend([4, -1])
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert policy.sequence_outputs == (("next_char_logits", 2),)


def test_without_a_length_input_nothing_is_grouped() -> None:
    config = parse_pbtxt(CHAR_LSTM)
    config.ClearField("batchserve")
    config.dynamic_batching.max_queue_delay_microseconds = 0
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert policy.sequence_inputs == ()
    assert policy.aging_ns == 10 * 1_000_000  # a greedy model ages after 10 ms


def test_without_dynamic_batching_a_sequence_model_still_knows_its_lengths() -> None:
    """Each request runs alone, but its lengths are still checked and its steps bounded."""
    config = parse_pbtxt(CHAR_LSTM)
    config.ClearField("dynamic_batching")
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert not policy.merge_requests
    assert (policy.sequence_inputs, policy.length_input) == ((("tokens", 1),), "lengths")
    assert policy.max_queue_size == 8


def test_each_level_takes_its_own_queue_policy_or_the_default_one() -> None:
    """Triton's priority_queue_policy (its L0_config_json dbatch config): a level's own
    timeout and override rule in place of the default policy's."""
    config = parse_pbtxt(
        'name: "m" max_batch_size: 4 dynamic_batching { priority_levels: 3 '
        "default_priority_level: 1 default_queue_policy { default_timeout_microseconds: 500 "
        "allow_timeout_override: true } priority_queue_policy { key: 2 value: { "
        "default_timeout_microseconds: 123 max_queue_size: 7 } } }"
    )
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert policy.queue_policy(1) == (500_000, True, 0, False)
    assert policy.queue_policy(2) == (123_000, False, 7, False)  # no override: its own timeout
    assert policy.queue_policy(3) == policy.queue_policy(1)
    assert not policy.delays_any


def test_each_level_delays_or_refuses_timed_out_requests_as_its_policy_says() -> None:
    """Triton's L0_model_queue ``test_priority_with_policy`` config: the default policy
    delays, level 2's own refuses."""
    config = parse_pbtxt(
        'name: "m" max_batch_size: 4 dynamic_batching { priority_levels: 2 '
        "default_priority_level: 2 default_queue_policy { timeout_action: DELAY "
        "allow_timeout_override: true default_timeout_microseconds: 11000000 } "
        "priority_queue_policy { key: 2 value: { timeout_action: REJECT "
        "allow_timeout_override: true default_timeout_microseconds: 11000000 } } }"
    )
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert policy.queue_policy(1) == (11_000_000_000, True, 0, True)
    assert policy.queue_policy(2) == (11_000_000_000, True, 0, False)
    assert policy.delays_any


def test_level_policies_without_priority_levels_apply_to_nothing() -> None:
    config = parse_pbtxt(
        'name: "m" max_batch_size: 4 dynamic_batching { priority_queue_policy { key: 1 '
        "value: { default_timeout_microseconds: 123 } } }"
    )
    policy = BatchPolicy.from_config(config, server_max_queue_size=8)
    assert policy.queue_policy(1) == (0, True, 0, False)  # the default policy: no timeout


def test_waiting_out_the_queue_delay_comes_from_the_config_or_the_server() -> None:
    """``batchserve { wait_out_queue_delay }`` turns Triton's rule on for one model, the
    server's ``--wait-out-queue-delay`` for all; a sequence model's steps follow it too."""
    plain = parse_pbtxt(CHAR_LSTM)
    assert not BatchPolicy.from_config(plain, 8).wait_out_queue_delay
    assert BatchPolicy.from_config(plain, 8, wait_out_queue_delay=True).wait_out_queue_delay
    own = parse_pbtxt(CHAR_LSTM)
    own.batchserve.wait_out_queue_delay = True
    assert BatchPolicy.from_config(own, 8).wait_out_queue_delay
    steps = parse_pbtxt(
        'name: "s" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }] '
        "sequence_batching { oldest { max_queue_delay_microseconds: 5000 } }"
    )
    assert BatchPolicy.from_config(steps, 8, wait_out_queue_delay=True).wait_out_queue_delay
    assert not BatchPolicy.from_config(steps, 8).wait_out_queue_delay


def test_the_scheduler_delay_holds_dynamic_and_sequence_batchers_only() -> None:
    """``--delay-scheduler``, as Triton's ``TRITONSERVER_DELAY_SCHEDULER``: the batchers of
    dynamic and sequence batching hold their first batch; an ensemble's does not."""
    batching = parse_pbtxt(CHAR_LSTM)
    assert batching.HasField("dynamic_batching")
    assert BatchPolicy.from_config(batching, 8, delay_scheduler=3).hold_first_batch == 3
    assert BatchPolicy.from_config(batching, 8).hold_first_batch == 0
    steps = parse_pbtxt(
        'name: "s" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }] '
        "sequence_batching { oldest { max_queue_delay_microseconds: 5000 } }"
    )
    assert BatchPolicy.from_config(steps, 8, delay_scheduler=2).hold_first_batch == 2
    ensemble = parse_pbtxt(
        'name: "e" platform: "ensemble" max_batch_size: 4 '
        'input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }] '
        'ensemble_scheduling { step [{ model_name: "m" model_version: -1 '
        'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } }] }'
    )
    assert BatchPolicy.from_config(ensemble, 8, delay_scheduler=2).hold_first_batch == 0
