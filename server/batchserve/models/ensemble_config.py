"""An ensemble's config: its steps, and Triton's checks of them, in Triton's words.

Two kinds of check, as Triton makes them. What the config alone shows (a step without a
model, a tensor written twice, an output no step writes, a tensor nobody reads) is checked
when the repository is read (``structure_problems``); what needs the composing models'
configs (inputs that do not exist, types and shapes that disagree, a batch cap the
ensemble exceeds) when the ensemble loads, its composing models loaded first
(``composing_problems``). The messages are Triton's ``model_config_utils.cc`` and
``ensemble_utils.cc``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from batchserve.proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelEnsembling,
    ModelInput,
    ModelOutput,
)

ENSEMBLE_PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: the composing model and version ("" for its latest) and its tensors, as
    (the model's name, the ensemble's name) pairs."""

    model: str
    version: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]

    @property
    def needs(self) -> frozenset[str]:
        return frozenset(tensor for _, tensor in self.inputs)


def is_ensemble(config: ModelConfig) -> bool:
    return (
        config.platform == ENSEMBLE_PLATFORM
        or config.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    )


def ensemble_steps(config: ModelConfig) -> tuple[EnsembleStep, ...]:
    return tuple(
        EnsembleStep(
            step.model_name,
            str(step.model_version) if step.model_version > 0 else "",
            tuple(sorted(step.input_map.items())),
            tuple(sorted(step.output_map.items())),
        )
        for step in config.ensemble_scheduling.step
    )


def needed_steps(steps: Sequence[EnsembleStep], wanted: Iterable[str]) -> tuple[EnsembleStep, ...]:
    """The steps that write, directly or through later steps, one of the ``wanted`` tensors:
    Triton prunes the others for a request that asks for fewer outputs than the ensemble
    has (a step runs when any of its outputs is needed)."""
    needed = set(wanted)
    chosen: set[int] = set()
    grew = True
    while grew:
        grew = False
        for index, step in enumerate(steps):
            if index not in chosen and any(tensor in needed for _, tensor in step.outputs):
                chosen.add(index)
                needed |= step.needs
                grew = True
    return tuple(step for index, step in enumerate(steps) if index in chosen)


def composing_models(config: ModelConfig) -> list[str]:
    """The models an ensemble's steps run, each once, in the order the steps name them."""
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def structure_problems(config: ModelConfig) -> list[str]:
    """Triton's ``ValidateEnsembleSchedulingConfig``: what the config alone gets wrong."""
    name = config.name
    if config.WhichOneof("scheduling_choice") != "ensemble_scheduling":
        return [
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        ]
    problems = []
    if config.instance_group:
        problems.append(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        problems.append(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        problems.append(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        problems.append(f"must specify 'step' for ensemble '{name}'")
    if problems:
        return problems
    graph_problem = _graph_problem(name, steps)
    if graph_problem:
        return [graph_problem]
    return _flow_problems(config)


def _graph_problem(name: str, steps: Sequence[ModelEnsembling.Step]) -> str:
    """Triton's ``BuildEnsembleGraph``: every step names a model, reads and writes something,
    and no tensor is written twice."""
    written: set[str] = set()
    for index, step in enumerate(steps):
        where = f"in step {index} of ensemble '{name}'"
        if not step.model_name:
            return f"must specify 'model_name' {where}"
        if not step.input_map:
            return f"must specify 'input_map' {where}"
        if not step.output_map:
            return f"must specify 'output_map' {where}"
        for tensor in step.output_map.values():
            if tensor in written:
                return (
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            written.add(tensor)
    return ""


def _flow_problems(config: ModelConfig) -> list[str]:
    """Triton's data-flow check: from the ensemble's inputs, which tensors get written;
    every output must be, and every tensor but the outputs must be read."""
    name = config.name
    steps = ensemble_steps(config)
    read = {tensor for step in steps for _, tensor in step.inputs}
    produced_by = {tensor: step for step in steps for _, tensor in step.outputs}
    known = read | set(produced_by)
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.name not in known:
                return [f"ensemble {kind} '{spec.name}' for ensemble {name}' is not used"]
    ready = _written(steps, {spec.name for spec in config.input})
    for spec in config.output:
        if spec.name not in ready:
            message = f"output '{spec.name}' for ensemble '{name}' is not written"
            source = _unconnected_source(spec.name, produced_by, ready)
            if source != spec.name:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            return [message]
    outputs = {spec.name for spec in config.output}
    for tensor in sorted(known - outputs):
        if tensor not in ready or tensor not in read:
            return [f"ensemble tensor '{tensor}' is unused in ensemble '{name}'"]
    return []


def _written(steps: Sequence[EnsembleStep], inputs: set[str]) -> set[str]:
    """Every tensor the steps come to write, given the ensemble's inputs (and those)."""
    ready = set(inputs)
    pending = list(steps)
    progress = True
    while progress:
        runnable = [step for step in pending if step.needs <= ready]
        for step in runnable:
            ready.update(tensor for _, tensor in step.outputs)
            pending.remove(step)
        progress = bool(runnable)
    return ready


def _unconnected_source(
    tensor: str, produced_by: Mapping[str, EnsembleStep], ready: set[str]
) -> str:
    """The furthest tensor upstream of ``tensor`` that is never written, as Triton names it."""
    seen = {tensor}
    current = tensor
    while current in produced_by:
        waiting = [
            t for t in sorted(produced_by[current].needs) if t not in ready and t not in seen
        ]
        if not waiting:
            break
        current = waiting[0]
        seen.add(current)
    return current


@dataclass(frozen=True, slots=True)
class _TensorNode:
    model: str
    data_type: DataType.ValueType
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def _node(
    model: str, batching: bool, data_type: DataType.ValueType, dims: Iterable[int]
) -> _TensorNode:
    own = tuple(dims)
    return _TensorNode(model, data_type, own, ((-1,) if batching else ()) + own)


def _dims_agree(left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    return len(left) == len(right) and all(
        a == b or a == -1 or b == -1 for a, b in zip(left, right, strict=True)
    )


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistency(left: _TensorNode, right: _TensorNode, prefix: str) -> str:
    if left.data_type != right.data_type:
        return (
            f"{prefix}inconsistent data type: {DataType.Name(left.data_type)} is inferred from "
            f"model {left.model} while {DataType.Name(right.data_type)} is inferred from "
            f"model {right.model}"
        )
    if not _dims_agree(left.dims, right.dims) and not _dims_agree(left.full_dims, right.full_dims):
        return (
            f"{prefix}inconsistent shape: {_dims_text(left.full_dims)} is inferred from model "
            f"{left.model} while {_dims_text(right.full_dims)} is inferred from model "
            f"{right.model}"
        )
    return ""


def composing_problems(config: ModelConfig, composing: Mapping[str, ModelConfig]) -> list[str]:
    """Triton's ``ValidateEnsembleConfig``: the steps against the composing models' configs
    as loaded (every one in ``composing``)."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _TensorNode] = {}
    for spec in list(config.input) + list(config.output):
        dims = spec.reshape.shape if spec.HasField("reshape") else spec.dims
        tensors[spec.name] = _node(name, batching, spec.data_type, dims)
    for step in config.ensemble_scheduling.step:
        model = composing[step.model_name]
        if model.max_batch_size != 0 and model.max_batch_size < config.max_batch_size:
            return [
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model_name} which only allows maximum batch size to "
                f"be {model.max_batch_size}"
            ]
        problem = _mapping_problem(name, step, model, tensors)
        if problem:
            return [problem]
    return []


def _mapping_problem(
    ensemble: str,
    step: ModelEnsembling.Step,
    model: ModelConfig,
    tensors: dict[str, _TensorNode],
) -> str:
    """Triton's ``ValidateTensorMapping`` for one step."""
    model_name = step.model_name
    for model_input, tensor in sorted(step.input_map.items()):
        if model_input not in {spec.name for spec in model.input}:
            return (
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {model_input} in model {model_name}"
            )
    for model_spec in model.input:
        if model_spec.name not in step.input_map and not model_spec.optional:
            return (
                f"in ensemble {ensemble}, input {model_spec.name} in model {model_name} is not "
                "mapped to any ensemble tensors"
            )
    for model_output, tensor in sorted(step.output_map.items()):
        if model_output not in {spec.name for spec in model.output}:
            return (
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from non-existing "
                f"output {model_output} in model {model_name}"
            )
    batching = model.max_batch_size > 0
    mapped: list[tuple[ModelInput | ModelOutput, str]] = [
        (spec, step.input_map[spec.name]) for spec in model.input if spec.name in step.input_map
    ]
    mapped += [
        (spec, step.output_map[spec.name]) for spec in model.output if spec.name in step.output_map
    ]
    for tensor_spec, mapped_to in mapped:
        node = _node(model_name, batching, tensor_spec.data_type, tensor_spec.dims)
        problem = _record(
            tensors, mapped_to, node, f"in ensemble {ensemble}, ensemble tensor {mapped_to}: "
        )
        if problem:
            return problem
    return ""


def _record(tensors: dict[str, _TensorNode], name: str, node: _TensorNode, prefix: str) -> str:
    known = tensors.get(name)
    if known is None:
        tensors[name] = node
        return ""
    return _consistency(known, node, prefix)


def answers_many(config: ModelConfig) -> bool:
    """Whether a model may answer a request any number of times: decoupled (an ensemble
    with a decoupled step is made so at load, as Triton makes it)."""
    return config.model_transaction_policy.decoupled


def decoupled_labels(
    config: ModelConfig, composing: Mapping[str, ModelConfig]
) -> tuple[dict[str, int], list[str]]:
    """Triton's decoupled workflow check (``ValidateEnsembleConfig``): each tensor's label,
    0 for the ensemble's inputs and what is made from them alone, a new one for the outputs
    of each decoupled step (one response, one set of them), inherited by what is made from
    those; and the problems: a step, or the ensemble's outputs, reading tensors of two
    labels, which no response of either could pair up."""
    labels = {spec.name: 0 for spec in config.input}
    steps = list(ensemble_steps(config))
    fresh = 0
    while steps:
        ready = [s for s in steps if all(t in labels for t in s.needs)]
        if not ready:
            break  # the rest read tensors nothing writes: a structure problem, told apart
        for step in ready:
            steps.remove(step)
            read = {labels[tensor] for tensor in step.needs} or {0}
            if len(read) > 1:
                return labels, [_mixed(config.name, step.model)]
            label = read.pop()
            if answers_many(composing[step.model]):
                fresh += 1
                label = fresh
            for _, tensor in step.outputs:
                labels[tensor] = label
    if len({labels[spec.name] for spec in config.output if spec.name in labels}) > 1:
        return labels, [_mixed(config.name, config.name)]
    return labels, []


def _mixed(ensemble: str, model: str) -> str:
    return (
        f"in ensemble {ensemble}, step of model '{model}' receives inputs originated from "
        "different decoupled models"
    )
