"""config.pbtxt parsing, completion from the model file, and every validation problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from batchserve.backends.selection import ONNX, format_from_config
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import ModelConfigError
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.models.model_config import (
    DEFAULT_MAX_BATCH_SIZE,
    complete_config,
    config_from_signature,
    load_pbtxt,
    parse_pbtxt,
    to_pbtxt,
)
from batchserve.models.model_directory import InvalidModel
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from onnx import TensorProto
from onnx_models import FP32, IMAGE, INT64, LOGITS, Tensor, build_model, write_model

FP = BY_WIRE["FP32"]
BATCHED = ModelSignature(
    (TensorSpec("image", FP, (DYNAMIC, 1, 8, 8)),), (TensorSpec("logits", FP, (DYNAMIC, 10)),)
)
FIXED = ModelSignature((TensorSpec("x", FP, (1, 4)),), (TensorSpec("y", FP, (1, 4)),))


def complete(text: str, signature: ModelSignature | None = BATCHED) -> ModelConfig:
    return complete_config(parse_pbtxt(text), name="m", model_format=ONNX, signature=signature)


# --- parsing ---------------------------------------------------------------------------------


def test_parse_error_names_file_position_and_field() -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse_pbtxt('name: "m"\nfoo: 1\n', source="m/config.pbtxt")
    assert caught.value.message == (
        'm/config.pbtxt: 2:1 : Message type "inference.ModelConfig" has no field named "foo".'
    )


def test_unknown_data_type_name_lists_the_valid_ones() -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse_pbtxt('input {\n  name: "x"\n  data_type: TYPE_FP33\n}\n', source="m/config.pbtxt")
    message = caught.value.message
    assert message.startswith("m/config.pbtxt: 3:14 : ")
    assert "has no value named TYPE_FP33. Expected one of TYPE_BOOL, " in message
    assert "TYPE_FP32" in message
    assert "TYPE_STRING" in message


def test_long_source_line_is_cut_around_the_error() -> None:
    text = 'input { name: "' + "a" * 200 + '" data_type: TYPE_FP33 }'
    with pytest.raises(ModelConfigError) as caught:
        parse_pbtxt(text)
    message = caught.value.message
    assert "TYPE_FP33" in message.split("': ")[0]  # the excerpt shows the token at fault
    assert "a" * 100 not in message


def test_load_pbtxt_names_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b"name: \xff")
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt: cannot read"):
        load_pbtxt(path)


def test_to_pbtxt_round_trips() -> None:
    config = parse_pbtxt('name: "m" input { name: "x" data_type: TYPE_INT64 dims: [2, -1] }')
    text = to_pbtxt(config)
    assert "dims: [2, -1]" in text
    assert parse_pbtxt(text) == config


def test_config_from_signature_drops_the_batch_axis_only_when_batching() -> None:
    batched = config_from_signature("m", BATCHED, 8)
    assert list(batched.input[0].dims) == [1, 8, 8]
    assert batched.input[0].data_type == FP.config
    unbatched = config_from_signature("m", BATCHED, 0)
    assert list(unbatched.output[0].dims) == [-1, 10]


# --- completion ------------------------------------------------------------------------------


def test_empty_config_completes_fully() -> None:
    config = complete("")
    assert config.name == "m"
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("image", FP.config, [1, 8, 8])
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [10])]
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_AUTO)]
    assert config.version_policy.latest.num_versions == 1


def test_fixed_leading_axis_keeps_max_batch_size_zero() -> None:
    config = complete("", FIXED)
    assert config.max_batch_size == 0
    assert config.WhichOneof("scheduling_choice") is None
    assert list(config.input[0].dims) == [1, 4]


def test_full_rank_dims_mean_the_config_describes_the_batch_axis_itself() -> None:
    config = complete('input { name: "image" dims: [-1, 1, 8, 8] }')
    assert config.max_batch_size == 0
    assert list(config.output[0].dims) == [-1, 10]


def test_listed_tensor_gets_its_type_and_dims_and_explicit_values_stay() -> None:
    config = complete(
        'max_batch_size: 4 sequence_batching {} input { name: "image" } '
        "instance_group { kind: KIND_CPU } version_policy { all {} }"
    )
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    assert (config.input[0].data_type, list(config.input[0].dims)) == (FP.config, [1, 8, 8])
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_CPU)]
    assert config.version_policy.WhichOneof("policy_choice") == "all"


def test_a_tensor_with_nothing_per_sample_completes_as_triton_completes_it() -> None:
    """Triton's ONNX Runtime and TensorRT backends: dims [1], with an empty reshape when the
    model batches (Triton refuses one when it does not, and reads the scalar rule instead)."""
    batch_only = ModelSignature(
        (TensorSpec("x", FP, (DYNAMIC, 4)), TensorSpec("offset", FP, (DYNAMIC,))),
        (TensorSpec("label", BY_WIRE["INT64"], (DYNAMIC,)),),
    )
    config = complete("", batch_only)
    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    described = [(t.name, list(t.dims), t.HasField("reshape"), list(t.reshape.shape))
                 for t in [*config.input, *config.output]]  # fmt: skip
    assert described == [
        ("x", [4], False, []),
        ("offset", [1], True, []),
        ("label", [1], True, []),
    ]
    scalars = ModelSignature((TensorSpec("x", FP, ()),), (TensorSpec("y", FP, ()),))
    config = complete("", scalars)
    assert config.max_batch_size == 0
    assert [(list(t.dims), t.HasField("reshape")) for t in [*config.input, *config.output]] == [
        ([1], False),
        ([1], False),
    ]


def test_without_a_signature_tensors_stay_as_written() -> None:
    config = complete('input { name: "x" }', signature=None)
    assert len(config.input) == 1
    assert not config.output
    assert config.max_batch_size == 0
    assert config.backend == "onnxruntime"


def test_completion_leaves_the_input_untouched() -> None:
    original = parse_pbtxt('input { name: "image" }')
    complete_config(original, name="m", model_format=ONNX, signature=BATCHED)
    assert original == parse_pbtxt('input { name: "image" }')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'backend: "python"',
            "field 'backend' is 'python': batchserve does not support the backend (yet); "
            "batchserve serves ONNX (.onnx)",
        ),
        (
            'platform: "pytorch_libtorch"',
            "field 'platform' is 'pytorch_libtorch': batchserve does not support",
        ),
        (  # Triton's words first (its ValidateModelConfig)
            'platform: "onnxruntime_onnx" backend: "tensorrt"',
            "m/config.pbtxt: unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, "
            "tensorrt (batchserve: platform 'onnxruntime_onnx' contradicts backend 'tensorrt'",
        ),
        (  # L0_model_config special_cases/invalid_platform: the backend from the file name
            'platform: "onnxruntim" default_model_filename: "model.onnx"',
            "m/config.pbtxt: unexpected 'platform' and 'backend' pair, got:onnxruntim, "
            "onnxruntime (batchserve: field 'platform' is 'onnxruntim': batchserve does not "
            "support the platform (yet)",
        ),
    ],
)
def test_format_from_config_rejects_other_runtimes(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=r"^m/config\.pbtxt: ") as caught:
        format_from_config(parse_pbtxt(text), source="m/config.pbtxt")
    assert message in caught.value.message


# --- validation, through a real repository ------------------------------------------------------

LENGTHS_FP: Tensor = ("lengths", FP32, ("N", 1))
LENGTHS_BF16: Tensor = ("lengths", TensorProto.BFLOAT16, ("N", 1))
LENGTHS_WIDE: Tensor = ("lengths", INT64, ("N", 2))
LENGTHS: Tensor = ("lengths", INT64, ("N", 1))
FIXED_IMAGE: Tensor = ("image", FP32, (1, 1, 8, 8))
FIXED_LOGITS: Tensor = ("logits", FP32, (1, 10))


def problems_of(tmp_path: Path, config: str, inputs: tuple[Tensor, ...] = (IMAGE,)) -> list[str]:
    outputs = (FIXED_LOGITS,) if inputs[0] == FIXED_IMAGE else (LOGITS,)
    write_model(tmp_path / "digits" / "1" / "model.onnx", build_model(inputs, outputs))
    (tmp_path / "digits" / "config.pbtxt").write_text(config)
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path).resolve("digits")
    return list(caught.value.problems)


@pytest.mark.parametrize(
    ("config", "inputs", "expected"),
    [
        (
            'input { name: "image" } input { name: "extra" }',
            (IMAGE,),
            "unexpected inference input 'extra', allowed inputs are: image (batchserve: input "
            "'extra' is not an input of the model, which has 'image') (digits/1/model.onnx)",
        ),
        ('output { name: "probs" }', (IMAGE,), "output 'probs' is not an output of the model"),
        (
            'input { name: "image" }',
            (IMAGE, LENGTHS),
            "model input 'lengths' is missing from the config's inputs (digits/1/model.onnx)",
        ),
        ('input { name: "image" } input { name: "image" }', (IMAGE,), "input 'image' is listed 2"),
        (
            'input { name: "image" data_type: TYPE_FP16 }',
            (IMAGE,),
            "input 'image': data_type TYPE_FP16 contradicts the model's TYPE_FP32",
        ),
        (
            'input { name: "image" dims: [8, 8] }',
            (IMAGE,),
            "input 'image': dims [8, 8] contradict the model's [1, 8, 8]",
        ),
        (
            'output { name: "logits" dims: [11] }',
            (IMAGE,),
            "output 'logits': dims [11] contradict the model's [10]",
        ),
        (
            'input { name: "image" dims: [1, -2, 8] }',
            (IMAGE,),
            "model input 'image' dimension must be integer >= 1, or -1 to indicate a "
            "variable-size dimension for digits (batchserve: dims [1, -2, 8])",
        ),
        (
            'input { name: "image" dims: [1, 0, 8] }',
            (IMAGE,),
            "model input 'image' dimension must be integer >= 1, or -1 to indicate a "
            "variable-size dimension for digits (batchserve: dims [1, 0, 8])",
        ),
        (
            'input { name: "image" dims: [1, 65536, 65536] }',
            (IMAGE,),
            "input 'image': dims [1, 65536, 65536] hold 4294967296 elements a sample, more than "
            "a tensor may (2147483648)",
        ),
        (
            'input { name: "image" reshape { shape: [1, 8, 9] } dims: [72] }',
            (IMAGE,),
            "input 'image': reshape.shape [1, 8, 9] contradict the model's [1, 8, 8]",
        ),
        ('name: "other"', (IMAGE,), "name 'other' differs from the model directory name 'digits'"),
        ("max_batch_size: -1", (IMAGE,), "'max_batch_size' must be non-negative value for digits"),
        (
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [4, 16] }",
            (IMAGE,),
            "dynamic_batching.preferred_batch_size 16 is outside 1..max_batch_size (8)",
        ),
        (
            "dynamic_batching { preferred_batch_size: [0] }",
            (IMAGE,),
            "dynamic_batching.preferred_batch_size 0 is outside 1..max_batch_size (32)",
        ),
        (
            "dynamic_batching { preferred_batch_size: [2] }",
            (FIXED_IMAGE,),
            "dynamic_batching.preferred_batch_size 2 is outside 1..max_batch_size (0)",
        ),
        (
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [16] }",
            (IMAGE,),
            "dynamic batching preferred size must be <= max batch size for digits (batchserve: ",
        ),
        (
            "dynamic_batching { preferred_batch_size: [-1] }",
            (IMAGE,),
            "dynamic batching preferred size must be positive for digits (batchserve: ",
        ),
        (
            "max_batch_size: 8 sequence_batching { oldest { preferred_batch_size: [9] } }",
            (IMAGE,),
            "sequence batching preferred batch size must be <= max batch size for digits "
            "(batchserve: sequence_batching.oldest.preferred_batch_size 9 is outside "
            "1..max_batch_size (8))",
        ),
        (
            'input { name: "" }',
            (IMAGE,),
            "model input must specify 'name' for digits (batchserve: input[0] has no name)",
        ),
        (
            'input { name: "image" format: FORMAT_NCHW dims: [1, 64] }',
            (IMAGE,),
            "model input NHWC/NCHW require 3 dims for digits (batchserve: input 'image' has "
            "format FORMAT_NCHW and dims [1, 64]",
        ),
        (
            "sequence_batching { } response_cache { enable: true }",
            (IMAGE,),
            "Response Cache does not currently support model digits with sequence batching "
            "scheduler. Please disable the response cache.",
        ),
        (
            "model_transaction_policy { decoupled: true } response_cache { enable: true }",
            (IMAGE,),
            "Response Cache does not currently support model digits with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        ),
        (
            "instance_group { kind: KIND_MODEL gpus: [0] }",
            (IMAGE,),
            "instance group digits_0 of model digits has kind KIND_MODEL but specifies one or "
            "more GPUs (batchserve: ",
        ),
        (
            'instance_group { kind: KIND_CPU profile: ["0"] }',
            (IMAGE,),
            "instance group digits_0 of model digits and platform onnxruntime_onnxspecifies "
            "profile field which is only supported for TensorRT models (batchserve: ",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            (IMAGE,),
            "default priority level must be in range [1, 2] for digits "
            "(dynamic_batching.default_priority_level 3)",
        ),
        (
            "dynamic_batching { default_priority_level: 1 }",
            (IMAGE,),
            "dynamic_batching.default_priority_level 1 is set without priority_levels",
        ),
        ("instance_group { count: -1 }", (IMAGE,), "instance_group[0].count -1 is negative"),
        (
            "instance_group { count: 1 } instance_group { kind: KIND_CPU gpus: [0, 1] }",
            (IMAGE,),
            "instance group digits_1 of model digits has kind KIND_CPU but specifies one or "
            "more GPUs (batchserve: instance_group[1] lists gpus [0, 1])",
        ),
        (
            'batchserve { sequence_length_input: "lengths" }',
            (IMAGE,),
            "batchserve.sequence_length_input 'lengths' is not one of the inputs",
        ),
        (
            'batchserve { sequence_length_input: "lengths" }',
            (IMAGE, LENGTHS_FP),
            "batchserve.sequence_length_input 'lengths' must be an integer input with dims [1], "
            "not TYPE_FP32 [1]",
        ),
        (
            "batchserve { length_buckets { disabled: true } }",
            (IMAGE,),
            "batchserve.length_buckets needs batchserve.sequence_length_input",
        ),
        (
            "batchserve { max_batch_steps: 4096 }",
            (IMAGE,),
            "batchserve.max_batch_steps needs batchserve.sequence_length_input or an input",
        ),
        (
            'max_batch_size: 0 batchserve { sequence_length_input: "lengths" max_batch_steps: 9 }',
            (FIXED_IMAGE, ("lengths", INT64, (1,))),
            "batchserve.max_batch_steps needs max_batch_size > 0",
        ),
        (
            "batchserve { length_buckets { step_cost_rows: -2 } }",
            (IMAGE,),
            "batchserve.length_buckets.step_cost_rows must be 0 (learn it) or more, not -2",
        ),
        (
            'batchserve { sequence_length_input: "lengths" }',
            (IMAGE, LENGTHS_BF16),
            "not TYPE_BF16 [1]",
        ),
        (
            'batchserve { sequence_length_input: "lengths" }',
            (IMAGE, LENGTHS_WIDE),
            "not TYPE_INT64 [2]",
        ),
        (
            "max_batch_size: 8",
            (FIXED_IMAGE,),
            "max_batch_size 8 needs a leading dynamic batch axis, but the model's input 'image' "
            "has shape [1, 1, 8, 8]",
        ),
        (
            'backend: "python"',
            (IMAGE,),
            "field 'backend' is 'python': batchserve does not support the backend (yet)",
        ),
        (
            "version_policy { latest { num_versions: 0 } }",
            (IMAGE,),
            "version_policy.latest.num_versions must be at least 1",
        ),
        (
            "version_policy { specific { versions: [0, 1] } }",
            (IMAGE,),
            "version_policy.specific lists version 0; versions are >= 1",
        ),
        ("version_policy { specific { } }", (IMAGE,), "version_policy.specific lists no versions"),
        (  # Triton's pairing checks, in its words; ensembles are still not supported
            "ensemble_scheduling { }",
            (IMAGE,),
            "ensemble scheduling cannot be set for model 'digits' whose platform is not ensemble",
        ),
        (
            "max_batch_size: 8 dynamic_batching { preserve_ordering: true "
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100 } }",
            (IMAGE,),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
            "for digits",
        ),
        (
            "max_batch_size: 8 dynamic_batching { preserve_ordering: true priority_queue_policy "
            "{ key: 1 value { timeout_action: DELAY default_timeout_microseconds: 100 } } }",
            (IMAGE,),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
            "for digits",
        ),
        (
            'input { name: "image" dims: [2, -1] reshape { shape: [2, -1, -1] } }',
            (IMAGE,),
            "model input 'image' has different number of variable-size dimensions for dims and "
            "reshape for digits (batchserve: dims [2, -1], reshape [2, -1, -1])",
        ),
        ("foo: 1", (IMAGE,), '1:1 : Message type "inference.ModelConfig" has no field named "foo"'),
        (
            "input { data_type: TYPE_FP33 }",
            (IMAGE,),
            'Enum type "inference.DataType" has no value named TYPE_FP33',
        ),
    ],
)
def test_each_problem_names_the_config_file_and_field(
    tmp_path: Path, config: str, inputs: tuple[Tensor, ...], expected: str
) -> None:
    problems = problems_of(tmp_path, config, inputs)
    matching = [p for p in problems if expected in p]
    assert matching, problems
    assert matching[0].startswith("digits/config.pbtxt: ")


def test_the_readme_example_message_reads_exactly(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, 'input { name: "image" dims: [1, 8, 9] }')
    assert problems == [
        "digits/config.pbtxt: model 'digits', tensor 'image': the model expects 4 dimensions "
        "(shape [-1,1,8,8]) but the model configuration specifies 4 dimensions (an initial "
        "batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
        "making complete shape [-1,1,8,9]) (batchserve: input 'image': dims [1, 8, 9] "
        "contradict the model's [1, 8, 8]) (digits/1/model.onnx)"
    ]


def test_every_problem_of_a_model_is_reported(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        'name: "x" instance_group { count: -2 } input { name: "image" data_type: TYPE_INT8 } '
        'output { name: "nope" }',
    )
    assert len(problems) == 4, problems
    assert all(p.startswith("digits/config.pbtxt: ") for p in problems)


@pytest.mark.parametrize(
    ("config", "inputs"),
    [
        ('input { name: "image" dims: [-1, 8, -1] }', (IMAGE,)),  # -1 where the model is fixed
        ('input { name: "image" dims: [1, 8, 8] }', (("image", FP32, ("N", 1, "H", "W")),)),
        ('input { name: "image" dims: [64] reshape { shape: [1, 8, 8] } }', (IMAGE,)),
        ("max_batch_size: 1", (FIXED_IMAGE,)),  # a fixed leading 1 serves batches of one
        # Triton queues for a model without a batch axis too, each request run alone
        ("dynamic_batching { priority_levels: 2 default_priority_level: 1 }", (FIXED_IMAGE,)),
        (
            'batchserve { sequence_length_input: "lengths" } '
            "dynamic_batching { preferred_batch_size: [8, 32] priority_levels: 2 "
            "default_priority_level: 2 }",
            (IMAGE, LENGTHS),
        ),
    ],
)
def test_configs_the_model_allows_are_accepted(
    tmp_path: Path, config: str, inputs: tuple[Tensor, ...]
) -> None:
    outputs = (FIXED_LOGITS,) if inputs[0] == FIXED_IMAGE else (LOGITS,)
    write_model(tmp_path / "digits" / "1" / "model.onnx", build_model(inputs, outputs))
    (tmp_path / "digits" / "config.pbtxt").write_text(config)
    resolved = ModelRepository(tmp_path).resolve("digits")
    assert resolved.config.name == "digits"


SCALAR_IN: Tensor = ("x", FP32, ())
SCALAR_OUT: Tensor = ("y", FP32, ())


@pytest.mark.parametrize(
    ("dims", "accepted"),
    [("[1]", True), ("[1, 1]", True), ("[2]", False), ("[-1]", False)],
)
def test_a_scalar_of_a_model_that_does_not_batch_may_be_written_with_dims_of_one(
    tmp_path: Path, dims: str, accepted: bool
) -> None:
    """Triton's rule (its ONNX Runtime backend): any dims all 1, and nothing else."""
    write_model(tmp_path / "s" / "1" / "model.onnx", build_model((SCALAR_IN,), (SCALAR_OUT,)))
    (tmp_path / "s" / "config.pbtxt").write_text(
        f'max_batch_size: 0 input {{ name: "x" dims: {dims} }} output {{ name: "y" dims: [1] }}'
    )
    if accepted:
        resolved = ModelRepository(tmp_path).resolve("s")
        assert not resolved.config.input[0].HasField("reshape")  # the config as written
        return
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path).resolve("s")
    rank = len(dims.strip("[]").split(","))
    assert list(caught.value.problems) == [
        f"s/config.pbtxt: model 's', tensor 'x': the model expects 0 dimensions (shape []) but "
        f"the model configuration specifies {rank} dimensions (shape {dims.replace(' ', '')}) "
        f"(batchserve: input 'x': dims {dims} contradict the model's []) (s/1/model.onnx)"
    ]
