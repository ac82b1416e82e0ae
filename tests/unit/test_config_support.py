"""Config fields batchserve does not honour are refused at load, naming the field."""

from __future__ import annotations

import pytest
from batchserve.models.config_validation import config_problems
from batchserve.models.model_config import parse_pbtxt

TENSORS = """
name: "m"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]
"""


def _problems(extra: str, base: str = TENSORS) -> list[str]:
    return config_problems(parse_pbtxt(base + extra), source="m/config.pbtxt", directory="m")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
        ("sequence_batching { iterative_sequence: true }", "sequence_batching.iterative_sequence"),
        ('sequence_batching { state [{ input_name: "s" output_name: "t" data_type: TYPE_FP32 '
         "dims: [1] use_growable_memory: true }] }",
         "sequence_batching.state[0].use_growable_memory"),
        ("ensemble_scheduling { step [{ model_name: \"a\" model_version: -1 }] }",
         "ensemble_scheduling"),
        ('platform: "ensemble"', "platform"),
        ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 '
         'source_input: "x" }]', "batch_input"),
        ('batch_output [{ target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
         'source_input: "x" }]', "batch_output"),
        ('runtime: "model.py"', "runtime"),
        ('cc_model_filenames { key: "7.5" value: "model_75.plan" }', "cc_model_filenames"),
        ('model_operations { op_library_filename: "libops.so" }',
         "model_operations.op_library_filename"),
        ('model_repository_agents { agents [{ name: "checksum" }] }', "model_repository_agents"),
        ("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 1 value: { max_queue_size: 3 } } }",
         "dynamic_batching.priority_queue_policy"),
        ("dynamic_batching { default_queue_policy { timeout_action: DELAY } }",
         "dynamic_batching.default_queue_policy.timeout_action"),
    ],
)  # fmt: skip
def test_each_unsupported_field_is_refused_by_name(extra: str, field: str) -> None:
    problems = [p for p in _problems(extra) if "batchserve does not support" in p]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"m/config.pbtxt: field '{field}' ")
    assert problems[0].endswith("(yet)")


@pytest.mark.parametrize(
    ("tensor", "field"),
    [
        ("is_shape_tensor: true", "input.is_shape_tensor"),
        ("is_non_linear_format_io: true", "input.is_non_linear_format_io"),
        ("allow_ragged_batch: true", "input.allow_ragged_batch"),
    ],
)
def test_unsupported_tensor_fields_name_the_tensor(tensor: str, field: str) -> None:
    base = TENSORS.replace("dims: [ 4 ] }]\noutput", f"dims: [ 4 ] {tensor} }}]\noutput")
    problems = _problems("", base)
    assert problems == [
        f"m/config.pbtxt: field '{field}' is true for input 'x': batchserve does not support "
        + problems[0].split("batchserve does not support ", 1)[1]
    ]


@pytest.mark.parametrize(
    "extra",
    [
        "response_cache { enable: true }",
        'metric_tags { key: "team" value: "vision" }',
        "model_transaction_policy { decoupled: false }",
        "dynamic_batching { max_queue_delay_microseconds: 100 preserve_ordering: true }",
        "optimization { input_pinned_memory { enable: false } }",
        "instance_group [{ kind: KIND_CPU count: 2 rate_limiter { priority: 2 } }]",
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }',
    ],
)
def test_fields_that_do_not_change_results_still_load(extra: str) -> None:
    assert _problems(extra) == []


def test_a_sequence_model_without_a_batch_axis_is_accepted() -> None:
    """As in Triton (its QA's nobatch sequence models); it used to be refused."""
    base = TENSORS.replace("max_batch_size: 4", "max_batch_size: 0")
    assert _problems("sequence_batching { }", base) == []


def test_a_plain_sequence_config_is_accepted() -> None:
    config = """sequence_batching {
      control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START
                                                int32_false_true: [0, 1] }] }]
      state [{ input_name: "s" output_name: "t" data_type: TYPE_FP32 dims: [1]
               initial_state [{ data_type: TYPE_FP32 dims: [1] zero_data: true name: "z" }] }]
    }"""
    assert [p for p in _problems(config) if "batchserve does not support" in p] == []


@pytest.mark.parametrize("utilization", ["-0.5", "1.5"])
def test_a_slot_utilization_outside_0_to_1_is_refused_in_triton_s_words(utilization: str) -> None:
    problems = _problems(
        f"sequence_batching {{ direct {{ minimum_slot_utilization: {utilization} }} }}"
    )
    assert any(
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m" in p
        for p in problems
    ), problems


def test_a_full_slot_utilization_and_a_negative_candidate_count() -> None:
    assert _problems("sequence_batching { direct { minimum_slot_utilization: 1.0 } }") == []
    problems = _problems("sequence_batching { oldest { max_candidate_sequences: -2 } }")
    assert problems == [
        "m/config.pbtxt: sequence_batching.oldest.max_candidate_sequences -2 is negative"
    ]
