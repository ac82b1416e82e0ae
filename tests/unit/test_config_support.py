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
        ('sequence_batching {} batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "n" '
         'data_type: TYPE_FP32 source_input: "x" }]', "batch_input"),
        ('sequence_batching {} batch_output [{ target_name: "y" source_input: "x" }]',
         "batch_output"),
        ('cc_model_filenames { key: "7.5" value: "model_75.plan" }', "cc_model_filenames"),
        ('model_operations { op_library_filename: "libops.so" }',
         "model_operations.op_library_filename"),
        ('model_repository_agents { agents [{ name: "checksum" }] }', "model_repository_agents"),
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
    ],
)
def test_unsupported_tensor_fields_name_the_tensor(tensor: str, field: str) -> None:
    base = TENSORS.replace("dims: [ 4 ] }]\noutput", f"dims: [ 4 ] {tensor} }}]\noutput")
    problems = _problems('platform: "tensorrt_plan"', base)  # the one platform Triton allows
    assert problems == [
        f"m/config.pbtxt: field '{field}' is true for input 'x': batchserve does not support "
        + problems[0].split("batchserve does not support ", 1)[1]
    ]


@pytest.mark.parametrize(
    ("tensor", "triton"),
    [
        ("is_shape_tensor: true", "shape tensors are only supported for TensorRT platform"),
        (
            "is_non_linear_format_io: true",
            "Non-linear IO format is only supported for the TensorRT platform",
        ),
    ],
)
def test_tensorrt_only_tensor_fields_elsewhere_get_tritons_words_first(
    tensor: str, triton: str
) -> None:
    base = TENSORS.replace("dims: [ 4 ] }]\noutput", f"dims: [ 4 ] {tensor} }}]\noutput")
    problems = _problems('platform: "onnxruntime_onnx"', base)
    assert len(problems) == 2, problems  # Triton's, then what batchserve lacks
    assert problems[0].startswith(f"m/config.pbtxt: {triton} for m (batchserve: input 'x' ")
    assert "batchserve does not support" in problems[1]


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


@pytest.mark.parametrize(
    ("runtime", "triton"),
    [
        ("model.py", "unable to find backend library 'model.py' for model 'm'"),
        (
            "__invalid_runtime__",
            "unable to find backend library '__invalid_runtime__' for model 'm'",
        ),
        (
            "../dummy_runtime/libtriton_identity.so",
            "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend "
            "directory",
        ),
        (
            "/opt/libtriton_x.so",
            "backend library name '/opt/libtriton_x.so' escapes backend directory",
        ),
    ],
)  # fmt: skip
def test_a_runtime_library_batchserve_lacks_is_refused_in_tritons_words(
    runtime: str, triton: str
) -> None:
    """L0_model_config special_cases invalid_runtime and runtime_escape: Triton's words, then
    batchserve's, which runs its own backends."""
    assert _problems(f'backend: "onnxruntime" runtime: "{runtime}"') == [
        f"m/config.pbtxt: {triton} (batchserve: field 'runtime' is '{runtime}': batchserve does "
        "not support choosing a backend runtime library (yet))"
    ]


@pytest.mark.parametrize(
    "named", ['backend: "onnxruntime"', 'platform: "onnxruntime_onnx"', 'backend: "tensorrt"']
)
def test_a_runtime_naming_the_backends_own_library_is_accepted(named: str) -> None:
    """As Triton loads it: the library batchserve's own backend stands for, written out."""
    library = "libtriton_tensorrt.so" if "tensorrt" in named else "libtriton_onnxruntime.so"
    assert _problems(f'{named} runtime: "{library}"') == []
    assert _problems(f'{named} runtime: "libtriton_pytorch.so"') != []


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


def _control(name: str, body: str) -> str:
    return f'{{ name: "{name}" control [{{ {body} }}] }}'


@pytest.mark.parametrize(
    ("controls", "problem"),
    [
        # Triton's L0_model_config noautofill cases, by name
        ([_control("START", "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]"),
          _control("START", "kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]")],
         "sequence batching control tensor 'START' is specified for multiple control kinds "
         "for m"),  # control_tensor_multiple
        ([_control("S1", "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]"),
          _control("S2", "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]")],
         "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
        ([_control("E1", "kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]"),
          _control("E2", "kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]")],
         "sequence batching specifies multiple CONTROL_SEQUENCE_END tensors for m"),
        ([_control("READY", "kind: CONTROL_SEQUENCE_READY")],  # control_tensor_no_value
         "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
         "'bool_false_true' for CONTROL_SEQUENCE_READY for m"),
        ([_control("READY", "kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] "
                            "fp32_false_true: [0, 1]")],
         "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
         "and 'bool_false_true' for CONTROL_SEQUENCE_READY for m"),
        ([_control("START", "kind: CONTROL_SEQUENCE_START bool_false_true: [true]")],
         "sequence batching control 'bool_false_true' must have exactly 2 entries for "
         "CONTROL_SEQUENCE_START for m"),
        ([_control("ID", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 "
                         "int32_false_true: [0, 1]")],
         "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
         "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m"),
        ([_control("", "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]")],
         "sequence batching control tensor must have a name for m"),
    ],
)  # fmt: skip
def test_control_inputs_triton_refuses_are_refused_in_its_words(
    controls: list[str], problem: str
) -> None:
    """These loaded (the first three) or failed with an IndexError from reading the values
    by position (a control without any)."""
    config = f"sequence_batching {{ control_input [{', '.join(controls)}] }}"
    assert f"m/config.pbtxt: {problem}" in _problems(config)


def test_priority_queue_policies_load_and_their_levels_are_checked_in_triton_s_words() -> None:
    """Triton's dbatch and max_priority_level configs (L0_config_json) set them; they used
    to be refused as unsupported."""
    policies = (
        "priority_queue_policy { key: 1 value: { default_timeout_microseconds: 123 } } "
        "priority_queue_policy { key: 2 value: { max_queue_size: 3 } }"
    )
    two, one = (
        f"dynamic_batching {{ priority_levels: {n} default_priority_level: 1 {policies} }}"
        for n in (2, 1)
    )
    assert _problems(two) == []
    assert _problems(one) == [
        "m/config.pbtxt: priority queue policy must have priority level in range [1, 1] for m "
        "(dynamic_batching.priority_queue_policy key 2)"
    ]


def test_ordered_answers_with_several_priority_levels_are_refused_in_triton_s_words() -> None:
    """Triton's L0_model_config case: requests served by priority cannot be answered in
    the order they came; it used to load."""
    config = (
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 preserve_ordering: true }"
    )
    assert _problems(config) == [
        "m/config.pbtxt: Only one priority level is allowed when 'preserve_ordering' is true for m"
    ]


def test_a_ragged_input_of_a_sequence_model_is_refused_by_name() -> None:
    base = TENSORS.replace(
        "dims: [ 4 ] }]\noutput", "dims: [ -1 ] allow_ragged_batch: true }]\noutput"
    )
    problems = [p for p in _problems("sequence_batching {}", base) if "does not support" in p]
    assert problems == [
        "m/config.pbtxt: field 'input.allow_ragged_batch' is true for input 'x': batchserve does "
        "not support ragged batching in a sequence model (yet)"
    ]


def test_a_negative_gpu_id_is_refused_in_tritons_words_before_any_model_file_is_read() -> None:
    """Triton's L0_model_config ``negative_gpu`` case: its version directory is empty, and
    Triton names the group (``<model>_<position>`` when unnamed) and the id before anything
    about the file. The GPUs present are counted only at load, so here they are not listed."""
    problems = _problems("instance_group [{ gpus: [0] }, { kind: KIND_GPU gpus: [-1] }]")
    assert problems == [
        "m/config.pbtxt: instance group m_1 of model m specifies invalid or unsupported gpu id "
        "-1. GPUs with at least the minimum required CUDA compute compatibility (batchserve "
        "sets none) are: numbered from 0 (batchserve: instance_group[1] lists gpus [-1]: a GPU "
        "index is 0 or more)"
    ]
