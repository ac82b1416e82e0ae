"""Checks of a config's ragged batching (``scheduler/batch_io.py``): in the config alone,
Triton's ``ValidateBatchIO`` in its words (triton core ``model_config_utils.cc``); against
the model file, the ONNX Runtime backend's (``onnxruntime.cc``: a ragged input is one flat
[-1] axis in the model); and what batchserve adds so that a config it would misread is
refused at load rather than answered wrongly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from batchserve.core.datatypes import config_name
from batchserve.core.signature import DYNAMIC, ModelSignature
from batchserve.proto.model_config_pb2 import BatchInput, BatchOutput, DataType, ModelConfig

_BATCH_INPUT_TYPES = (DataType.TYPE_INT32, DataType.TYPE_FP32)
_INPUT_KINDS = {int(value): name for name, value in BatchInput.Kind.items()}
_OUTPUT_KINDS = {int(value): name for name, value in BatchOutput.Kind.items()}


def batch_io_problems(config: ModelConfig) -> list[str]:
    """What is wrong with the config's batch inputs, batch outputs and ragged inputs."""
    triton = _triton_problems(config)
    # Triton stops at its first problem and names the model after it
    problems = [f"{triton[0]} for {config.name}"] if triton else []
    return problems + _own_problems(config)


def _triton_problems(config: ModelConfig) -> list[str]:
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    problems: list[str] = []
    for entry in config.batch_input:
        problems += _kind_problems("batch input", entry.kind, _INPUT_KINDS, entry.source_input)
        if entry.data_type not in _BATCH_INPUT_TYPES:
            problems.append("batch input data type must be TYPE_INT32 or TYPE_FP32")
        problems += _unknown_sources(entry.source_input, inputs)
    for output in config.batch_output:
        problems += _batch_output_problems(output, inputs, outputs)
    return problems


def _batch_output_problems(output: BatchOutput, inputs: set[str], outputs: set[str]) -> list[str]:
    problems = _kind_problems("batch output", output.kind, _OUTPUT_KINDS, output.source_input)
    problems += _unknown_sources(output.source_input, inputs)
    seen: set[str] = set()
    for target in output.target_name:
        if target not in outputs:
            problems.append(f"unknown target output name '{target}'")
        elif target in seen:
            problems.append(f"target output name '{target}' can only be specified once")
        seen.add(target)
    return problems


def _kind_problems(
    what: str, kind: int, kinds: Mapping[int, str], sources: Sequence[str]
) -> list[str]:
    """Triton's checks of a batch input's or output's kind: known, with one source."""
    if kind not in kinds:
        return [f"unknown {what} kind '{kind}'"]
    if len(sources) != 1:
        return [f"{what} kind '{kinds[kind]}' expects 1 source input, got {len(sources)}"]
    return []


def _unknown_sources(sources: Iterable[str], inputs: set[str]) -> list[str]:
    return [f"unknown source input name '{name}'" for name in sources if name not in inputs]


def _own_problems(config: ModelConfig) -> list[str]:
    """What Triton leaves to fail at run time, or batchserve cannot do with it."""
    problems: list[str] = []
    inputs = {tensor.name for tensor in config.input}
    targets = Counter(target for entry in config.batch_input for target in entry.target_name)
    for index, entry in enumerate(config.batch_input):
        if not entry.target_name:
            problems.append(f"batch_input[{index}] names no target_name: it would feed nothing")
    problems += [
        f"batch input target '{name}' is also an input of the config: clients would send it "
        "and the batcher compute it"
        for name in sorted(targets)
        if name in inputs
    ]
    problems += [
        f"batch input target '{name}' is named by {count} batch inputs"
        for name, count in sorted(targets.items())
        if count > 1
    ]
    optional = {tensor.name for tensor in config.input if tensor.optional}
    sources = {name for entry in config.batch_input for name in entry.source_input}
    sources |= {name for entry in config.batch_output for name in entry.source_input}
    problems += [
        f"input '{name}' is optional and the source of a batch input or output: a request "
        "without it would leave the batcher nothing to compute from"
        for name in sorted(sources & optional)
    ]
    scattered = {target for output in config.batch_output for target in output.target_name}
    for output in config.output:
        if output.name in scattered and output.HasField("reshape"):
            problems.append(
                f"output '{output.name}' is a batch output and has a reshape: batchserve does "
                "not reshape an output it scatters by its source input's shape"
            )
    for tensor in config.input:
        if not tensor.allow_ragged_batch:
            continue
        if tensor.optional:
            problems.append(
                f"configuration expects model provides input with shape [-1] for ragged input "
                f"'{tensor.name}', which is not supported for optional input"
            )
        if tensor.HasField("reshape"):
            problems.append(
                f"input '{tensor.name}' is ragged and has a reshape: a ragged input reaches "
                "the model flat, one [-1] axis, so it has no shape to reshape"
            )
    ragged_batching = bool(config.batch_input or config.batch_output or _ragged(config))
    if ragged_batching and config.batchserve.sequence_length_input:
        problems.append(
            "batchserve.sequence_length_input pads requests to one length, and batch inputs, "
            "batch outputs and ragged inputs batch them unpadded: a model takes one or the other"
        )
    return problems


def _ragged(config: ModelConfig) -> list[str]:
    return [tensor.name for tensor in config.input if tensor.allow_ragged_batch]


def batch_input_targets(config: ModelConfig) -> frozenset[str]:
    """The model inputs the batcher computes (clients do not send them)."""
    return frozenset(target for entry in config.batch_input for target in entry.target_name)


def batch_output_targets(config: ModelConfig) -> frozenset[str]:
    """The outputs scattered by an input's shape (their dims are not the model's)."""
    return frozenset(target for entry in config.batch_output for target in entry.target_name)


def model_batch_io_problems(config: ModelConfig, signature: ModelSignature) -> list[str]:
    """Where the model file contradicts the config's ragged batching."""
    problems: list[str] = []
    model_inputs = {spec.name: spec for spec in signature.inputs}
    for entry in config.batch_input:
        for target in entry.target_name:
            spec = model_inputs.get(target)
            if spec is None:
                problems.append(
                    f"batch input target '{target}' is not an input of the model, which has "
                    + (", ".join(f"'{name}'" for name in model_inputs) or "none")
                )
            elif spec.datatype.config != entry.data_type:
                problems.append(
                    f"batch input target '{target}': data_type {config_name(entry.data_type)} "
                    f"contradicts the model's {config_name(spec.datatype.config)}"
                )
    for name in _ragged(config):
        spec = model_inputs.get(name)
        if spec is not None and list(spec.shape) != [DYNAMIC]:
            problems.append(
                f"unable to load model '{config.name}', configuration expects model provides "
                f"input with shape [-1]  for ragged input '{name}', model provides "
                f"{_shape_text(spec.shape)}"
            )
    return problems


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
