"""Check a completed ModelConfig, alone and against the model file it describes.

Every check returns messages instead of raising, so that a user sees all the problems of a
model at once. Each message starts with the config file and names the field or tensor.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from batchserve.backends.reshape import scalar_as_ones
from batchserve.backends.selection import TENSORRT
from batchserve.core.datatypes import BY_CONFIG, config_name
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.core.tensors import MAX_ELEMENTS
from batchserve.devices.placement import group_name, unsupported_gpu
from batchserve.models.batch_io_config import (
    batch_input_targets,
    batch_io_problems,
    batch_output_targets,
    model_batch_io_problems,
)
from batchserve.models.config_support import unsupported_problems
from batchserve.models.initial_states import initial_state_problems
from batchserve.models.io_config import io_problems
from batchserve.models.model_config import model_dims
from batchserve.models.model_metrics import model_metrics_problems
from batchserve.models.sequence_controls import control_problems
from batchserve.models.warmup_samples import warmup_problems
from batchserve.proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
    ModelQueuePolicy,
)
from batchserve.scheduler.sequences import SequencePolicy, filled_inputs

Tensor = ModelInput | ModelOutput


def config_problems(config: ModelConfig, *, source: str, directory: str) -> list[str]:
    """Problems visible in the config alone; ``directory`` is the model's directory name."""
    problems: list[str] = []
    if config.name and config.name != directory:
        problems.append(f"name '{config.name}' differs from the model directory name '{directory}'")
    if config.max_batch_size < 0:
        problems.append(
            f"'max_batch_size' must be non-negative value for {config.name} "
            f"(batchserve: max_batch_size {config.max_batch_size} is negative)"
        )
    problems += _batching_problems(config)
    problems += _ensemble_problems(config)
    problems += _instance_problems(config)
    problems += _policy_problems(config)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        problems += _tensor_list_problems(kind, tensors, config.name)
        problems += [
            problem
            for tensor in tensors
            if tensor.HasField("reshape")
            for problem in _reshape_problems(f"{kind} '{tensor.name}'", tensor, config)
        ]
    problems += io_problems(config)
    problems += _response_cache_problems(config)
    problems += _sequence_length_problems(config)
    problems += warmup_problems(config)
    problems += batch_io_problems(config)
    problems += unsupported_problems(config)
    problems += model_metrics_problems(config)
    return [f"{source}: {problem}" for problem in problems]


def _batching_problems(config: ModelConfig) -> list[str]:
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling == "sequence_batching":
        problems = control_problems(config)
        if problems:  # the sequence batcher cannot read the rest of it
            return problems
        return _sequence_strategy_problems(config) + initial_state_problems(config)
    if scheduling != "dynamic_batching":
        return []
    batching = config.dynamic_batching
    problems = _priority_problems(config.name, batching)
    levels = batching.priority_levels
    problems += [
        f"priority queue policy must have priority level in range [1, {levels}] for "
        f"{config.name} (dynamic_batching.priority_queue_policy key {level})"
        for level in sorted(batching.priority_queue_policy)
        if levels and not 1 <= level <= levels
    ]
    # With max_batch_size 0 Triton's dynamic batcher still queues (priorities, queue policy)
    # and runs each request alone; only a preferred size cannot hold.
    problems += _preferred_size_problems(
        "dynamic batching preferred size", "dynamic_batching", batching.preferred_batch_size, config
    )
    return problems


def _preferred_size_problems(
    what: str, field: str, sizes: Iterable[int], config: ModelConfig
) -> list[str]:
    """Each preferred batch size not in 1..max_batch_size, in Triton's words."""
    problems = []
    for size in sizes:
        if 0 < size <= config.max_batch_size:
            continue
        rule = "positive" if size <= 0 else "<= max batch size"
        problems.append(
            f"{what} must be {rule} for {config.name} (batchserve: {field}.preferred_batch_size "
            f"{size} is outside 1..max_batch_size ({config.max_batch_size}))"
        )
    return problems


def _priority_problems(name: str, batching: ModelDynamicBatching) -> list[str]:
    """Triton's checks of the priority levels, in its words first."""
    levels, default = batching.priority_levels, batching.default_priority_level
    if levels == 0 and default != 0:
        return [f"dynamic_batching.default_priority_level {default} is set without priority_levels"]
    if levels > 0 and not 1 <= default <= levels:
        return [
            f"default priority level must be in range [1, {levels}] for {name} "
            f"(dynamic_batching.default_priority_level {default})"
        ]
    if batching.preserve_ordering and levels > 1:  # answers in order, served by priority
        return [f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"]
    policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
    delaying = ModelQueuePolicy.DELAY
    delayed = [
        p for p in policies if p.default_timeout_microseconds and p.timeout_action == delaying
    ]
    if batching.preserve_ordering and delayed:
        return [
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
            f"true for {name}"
        ]
    return []


def _ensemble_problems(config: ModelConfig) -> list[str]:
    """Triton's checks that only an ensemble has ensemble scheduling and that an ensemble
    names no backend, in its words."""
    if config.platform == "ensemble" and config.backend:
        return [
            f"Ensemble model '{config.name}' must have platform type 'ensemble' and empty "
            f"backend type (batchserve: it names backend '{config.backend}')"
        ]
    scheduled = config.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    if scheduled and config.platform != "ensemble":
        return [
            f"ensemble scheduling cannot be set for model '{config.name}' whose platform is "
            "not ensemble"
        ]
    return []


def _response_cache_problems(config: ModelConfig) -> list[str]:
    """The response cache where Triton refuses it: a sequence model's answers depend on its
    state, and a decoupled model's are a stream, so neither can be answered from a cache."""
    if not config.response_cache.enable:
        return []
    unsupported = []
    if config.HasField("sequence_batching"):
        unsupported.append("sequence batching scheduler")
    if config.model_transaction_policy.decoupled:
        unsupported.append("'decoupled' transaction policy")
    return [
        f"Response Cache does not currently support model {config.name} with {what}. Please "
        "disable the response cache. (batchserve: response_cache.enable is true)"
        for what in unsupported
    ]


def _instance_problems(config: ModelConfig) -> list[str]:
    problems = []
    for index, group in enumerate(config.instance_group):
        field = f"instance_group[{index}]"
        if group.count < 0:
            problems.append(f"{field}.count {group.count} is negative")
        if group.kind == ModelInstanceGroup.KIND_CPU and group.gpus:
            problems.append(
                f"instance group {group_name(config, group, index)} of model "
                f"{config.name} has kind KIND_CPU but specifies one or more GPUs (batchserve: "
                f"{field} lists gpus {list(group.gpus)})"
            )
        elif group.kind == ModelInstanceGroup.KIND_MODEL and group.gpus:
            problems.append(
                f"instance group {group_name(config, group, index)} of model {config.name} has "
                f"kind KIND_MODEL but specifies one or more GPUs (batchserve: {field} lists "
                f"gpus {list(group.gpus)}; batchserve places no KIND_MODEL group either)"
            )
        # wrong on any machine: said before the model file is read, as Triton says it
        elif any(gpu < 0 for gpu in group.gpus):
            triton = unsupported_gpu(config, group, index, min(group.gpus), "numbered from 0")
            problems.append(
                f"{triton} (batchserve: {field} lists gpus {list(group.gpus)}: a GPU index is 0 "
                "or more)"
            )
        if group.profile and config.platform != TENSORRT.platform:
            # Triton's text as it prints it, no space before "specifies"
            problems.append(
                f"instance group {group_name(config, group, index)} of model {config.name} and "
                f"platform {config.platform}specifies profile field which is only supported "
                f"for TensorRT models (batchserve: {field} lists profiles "
                f"{list(group.profile)}, which only a TensorRT engine has)"
            )
    groups = config.instance_group
    if groups and all(group.passive for group in groups):
        problems.append(
            "every instance_group is passive: its instances would be loaded and no request "
            "ever run (give one group passive: false)"
        )
    return problems


def _policy_problems(config: ModelConfig) -> list[str]:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        return ["version_policy.latest.num_versions must be at least 1"]
    if choice == "specific" and not policy.specific.versions:
        return ["version_policy.specific lists no versions"]
    if choice == "specific":
        bad = [v for v in policy.specific.versions if v < 1]
        return [f"version_policy.specific lists version {v}; versions are >= 1" for v in bad]
    return []


def _tensor_list_problems(kind: str, tensors: Sequence[Tensor], model: str) -> list[str]:
    counts = Counter(tensor.name for tensor in tensors)
    problems = [f"{kind} '{name}' is listed {n} times" for name, n in counts.items() if n > 1]
    for tensor in tensors:
        problems += _dims_value_problems(f"{kind} '{tensor.name}'", list(tensor.dims), model)
    return problems


def _dims_value_problems(what: str, dims: list[int], model: str) -> list[str]:
    """Triton's words (core ``ValidateIOShape``), which name the model last."""
    if any(d < DYNAMIC or d == 0 for d in dims):
        return [
            f"model {what} dimension must be integer >= 1, or -1 to indicate a variable-size "
            f"dimension for {model} (batchserve: dims {dims})"
        ]
    elements = math.prod(d for d in dims if d != DYNAMIC)
    if elements > MAX_ELEMENTS:  # no request could carry one sample
        return [
            f"{what}: dims {dims} hold {elements} elements a sample, more than a tensor may "
            f"({MAX_ELEMENTS})"
        ]
    return []


def _reshape_problems(what: str, tensor: Tensor, config: ModelConfig) -> list[str]:
    """Triton's rules (core ``ValidateIOShape``): the same element count, and with free axes
    the same number of them and the same fixed size between each pair."""
    dims, shape, model = list(tensor.dims), list(tensor.reshape.shape), config.name
    if not shape and config.max_batch_size <= 0:
        return [
            f"model {what} cannot have empty reshape for non-batching model as scalar tensors "
            f"are not supported for {model}"
        ]
    if any(d < DYNAMIC or d == 0 for d in shape):
        return [
            f"model {what} reshape dimensions must be integer >= 1, or -1 to indicate a "
            f"variable-size dimension for {model} (batchserve: reshape {shape})"
        ]
    if not shape and dims == [1]:
        return []
    free = DYNAMIC in dims and DYNAMIC in shape
    if free and len(_chunks(dims)) != len(_chunks(shape)):
        return [
            f"model {what} has different number of variable-size dimensions for dims and "
            f"reshape for {model} (batchserve: dims {dims}, reshape {shape})"
        ]
    if _chunks(dims) != _chunks(shape):
        return [
            f"model {what} has different size for dims and reshape for {model} (batchserve: "
            f"dims {dims} and reshape {shape} must hold the same elements, with the same fixed "
            "sizes between -1 axes)"
        ]
    return []


def _chunks(dims: list[int]) -> list[int]:
    """Element counts between free (-1) axes: [2, 4, -1, 6] -> [8, 6]."""
    chunks, current = [], 1
    for dim in dims:
        if dim == DYNAMIC:
            chunks.append(current)
            current = 1
        else:
            current *= dim
    return [*chunks, current]


def _sequence_length_problems(config: ModelConfig) -> list[str]:
    name = config.batchserve.sequence_length_input
    buckets = config.batchserve.length_buckets
    if buckets.step_cost_rows < 0:
        return [f"batchserve.length_buckets.step_cost_rows must be 0 (learn it) or more, "
                f"not {buckets.step_cost_rows:g}"]  # fmt: skip
    if not name:
        if config.batchserve.HasField("length_buckets"):
            return ["batchserve.length_buckets needs batchserve.sequence_length_input: "
                    "only a sequence model's requests are grouped by length"]  # fmt: skip
        free = any(dim < 0 for tensor in config.input for dim in tensor.dims)
        if config.batchserve.max_batch_steps and not free:
            return ["batchserve.max_batch_steps needs batchserve.sequence_length_input or an "
                    "input with a free (-1) axis: only their batches are counted in "
                    "positions"]  # fmt: skip
    if config.batchserve.max_batch_steps and config.max_batch_size <= 0:
        return ["batchserve.max_batch_steps needs max_batch_size > 0: a model without a "
                "batch axis runs one request at a time"]  # fmt: skip
    if not name:
        return []
    field = f"batchserve.sequence_length_input '{name}'"
    tensor = next((t for t in config.input if t.name == name), None)
    if tensor is None:
        return [f"{field} is not one of the inputs"]
    datatype = BY_CONFIG.get(tensor.data_type)
    integer = datatype is not None and datatype.wire.startswith(("INT", "UINT"))
    if not integer or list(tensor.dims) != [1]:
        return [
            f"{field} must be an integer input with dims [1], not "
            f"{config_name(tensor.data_type)} {list(tensor.dims)}"
        ]
    return []


def model_problems(
    config: ModelConfig,
    signature: ModelSignature,
    *,
    source: str,
    model_file: str,
    auto_complete: bool = True,
) -> list[str]:
    """Where the config contradicts the model file (``model_file`` is named in each message);
    ``auto_complete``: the config was completed from the file, as Triton's would be."""
    batched = config.max_batch_size > 0
    problems = _batch_axis_problems(config.max_batch_size, signature)
    if problems and auto_complete:  # the ONNX Runtime backend's auto-complete says it so
        problems.insert(
            0,
            f"autofill failed for model '{config.name}': model does not support batching "
            "while non-zero max_batch_size is specified",
        )
    # controls that cannot be read are the config's own problem (``control_problems``)
    sequences = None if control_problems(config) else SequencePolicy.from_config(config)
    filled = filled_inputs(config)
    computed = batch_input_targets(config)
    # a ragged input is flat in the model, a scattered output shaped per request: their
    # shapes are checked by ``model_batch_io_problems``, their types here
    own_shapes = batch_output_targets(config) | {
        t.name for t in config.input if t.allow_ragged_batch
    }
    problems += _count_problems(config, signature, filled | computed)
    for kind, listed, specs in (
        ("input", config.input, signature.inputs),
        ("output", config.output, signature.outputs),
    ):
        if kind == "input":  # the sequence batcher fills these; clients do not send them
            if sequences is not None:
                problems += _sequence_name_problems(filled, sequences, signature)
            specs = tuple(spec for spec in specs if spec.name not in filled | computed)
        problems += _name_problems(kind, listed, specs, signature.defaulted)
        if kind == "input":
            specs += signature.defaulted
        by_name = {spec.name: spec for spec in specs}
        for tensor in listed:
            spec = by_name.get(tensor.name)
            if spec is not None:
                own_shape = tensor.name in own_shapes
                problems += _tensor_problems(kind, tensor, spec, batched, own_shape, config.name)
    problems += model_batch_io_problems(config, signature)
    return [f"{source}: {problem} ({model_file})" for problem in problems]


def _sequence_strategy_problems(config: ModelConfig) -> list[str]:
    """Triton's checks of the sequence batcher's strategy, in its words."""
    batching = config.sequence_batching
    utilization = batching.direct.minimum_slot_utilization
    if batching.HasField("direct") and not 0.0 <= utilization <= 1.0:
        return [
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] "
            f"for {config.name} (it is {utilization:g})"
        ]
    if batching.HasField("oldest") and batching.oldest.max_candidate_sequences < 0:
        return [
            f"sequence_batching.oldest.max_candidate_sequences "
            f"{batching.oldest.max_candidate_sequences} is negative"
        ]
    if batching.HasField("oldest"):
        return _preferred_size_problems(
            "sequence batching preferred batch size",
            "sequence_batching.oldest",
            batching.oldest.preferred_batch_size,
            config,
        )
    return []


def _sequence_name_problems(
    filled: frozenset[str], sequences: SequencePolicy, signature: ModelSignature
) -> list[str]:
    """Each control and state input, and each state output, must be the model's."""
    inputs = [spec.name for spec in signature.inputs]
    outputs = [spec.name for spec in signature.outputs]
    problems = [
        f"sequence_batching input '{name}' is not an input of the model, which has "
        f"{_quoted(inputs)}"
        for name in sorted(filled - set(inputs))
    ]
    problems += [
        f"sequence_batching state output '{name}' is not an output of the model, which has "
        f"{_quoted(outputs)}"
        for name in sequences.output_names
        if name not in outputs
    ]
    return problems


def _batch_axis_problems(max_batch_size: int, signature: ModelSignature) -> list[str]:
    """A batching config needs every tensor to lead with a free axis.

    A fixed leading 1 is accepted only with max_batch_size 1, where every batch holds one
    sample; a fixed leading N > 1 could only ever run full batches, which the batcher cannot
    promise.
    """
    if max_batch_size <= 0:
        return []
    allowed = (DYNAMIC, 1) if max_batch_size == 1 else (DYNAMIC,)
    return [
        f"max_batch_size {max_batch_size} needs a leading dynamic batch axis, "
        f"but the model's {kind} '{spec.name}' has shape {list(spec.shape)}"
        for kind, specs in (("input", signature.inputs), ("output", signature.outputs))
        for spec in specs
        if not spec.shape or spec.shape[0] not in allowed
    ]


def _count_problems(
    config: ModelConfig, signature: ModelSignature, filled: frozenset[str] | set[str]
) -> list[str]:
    """The backends' first check, in their words: the config's inputs and the ``filled``
    ones the server fills (sequence controls and states, batch inputs), as many as the
    model's. An input the model defaults may be listed or not; a filled name the model lacks
    is said by the name checks instead."""
    if not filled <= {spec.name for spec in signature.inputs}:
        return []
    optional = {spec.name for spec in signature.defaulted}
    expects = sum(1 for tensor in config.input if tensor.name not in optional) + len(filled)
    if expects == len(signature.inputs):
        return []
    return [
        f"unable to load model '{config.name}', configuration expects {expects} inputs, "
        f"model provides {len(signature.inputs)}"
    ]


def _name_problems(
    kind: str,
    listed: Sequence[Tensor],
    specs: tuple[TensorSpec, ...],
    defaulted: tuple[TensorSpec, ...],
) -> list[str]:
    """An unknown name in Triton's words first (the backends' ``CheckAllowedModelInput``)."""
    known = [spec.name for spec in specs]
    allowed = known + [spec.name for spec in defaulted] if kind == "input" else known
    written = {tensor.name for tensor in listed}
    problems = [
        f"unexpected inference {kind} '{name}', allowed {kind}s are: {', '.join(allowed)} "
        f"(batchserve: {kind} '{name}' is not an {kind} of the model, which has "
        f"{_quoted(allowed)})"
        for name in sorted(written - set(allowed))
    ]
    if kind == "input":
        problems += [
            f"model input '{name}' is missing from the config's inputs"
            for name in known
            if name not in written
        ]
        problems += [
            f"input '{tensor.name}' is optional, but the model has no default for it (only an "
            "input backed by an ONNX initializer can be left out)"
            for tensor in listed
            if isinstance(tensor, ModelInput) and tensor.optional and tensor.name in known
        ]
    return problems


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "none"


def _tensor_problems(
    kind: str,
    tensor: Tensor,
    spec: TensorSpec,
    batched: bool,
    own_shape: bool = False,
    model: str = "",
) -> list[str]:
    """``own_shape``: the tensor's shape in the model is not its dims (ragged batching)."""
    what = f"{kind} '{tensor.name}'"
    problems = []
    if tensor.data_type != spec.datatype.config:
        problems.append(
            f"{what}: data_type {config_name(tensor.data_type)} contradicts the model's "
            f"{config_name(spec.datatype.config)}"
        )
    if own_shape:
        return problems
    expected = list(spec.shape[1:] if batched and spec.shape else spec.shape)
    written = model_dims(tensor)
    if not _dims_agree(written, expected) and not scalar_as_ones(tensor, spec, batched=batched):
        field = "reshape.shape" if tensor.HasField("reshape") else "dims"
        ours = f"{what}: {field} {written} contradict the model's {expected}"
        problems.append(
            f"{_rank_words(model, tensor.name, spec, written, batched)} (batchserve: {ours})"
        )
    return problems


def _rank_words(model: str, name: str, spec: TensorSpec, written: list[int], batched: bool) -> str:
    """The ONNX Runtime backend's words for a tensor whose dims the model contradicts."""
    shape = _shape_text(list(spec.shape))
    start = (
        f"model '{model}', tensor '{name}': the model expects {len(spec.shape)} dimensions "
        f"(shape {shape}) but the model configuration specifies"
    )
    if not batched:
        return f"{start} {len(written)} dimensions (shape {_shape_text(written)})"
    full = [DYNAMIC, *written]
    return (
        f"{start} {len(full)} dimensions (an initial batch dimension because max_batch_size "
        f"> 0 followed by the explicit tensor shape, making complete shape {_shape_text(full)})"
    )


def _shape_text(shape: list[int]) -> str:
    """A shape as Triton writes it: ``[-1,16]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def _dims_agree(written: list[int], model: list[int]) -> bool:
    """Same rank, and every axis fixed on both sides has the same size."""
    return len(written) == len(model) and all(
        w == m or DYNAMIC in (w, m) for w, m in zip(written, model, strict=True)
    )


AUTO_COMPLETE_OFF = (
    "with --disable-auto-complete-config (or --strict-model-config true) nothing is filled in "
    "from the model file: the config must list every input and output with data_type and dims"
)


def without_gpu(model_file: str) -> str:
    """Why a TensorRT plan's config must say everything: it cannot be read without a GPU."""
    return (
        f"to validate {model_file} without a GPU, the config must list every input and "
        "output with data_type and dims"
    )


def completeness_problems(config: ModelConfig, *, source: str, need: str) -> list[str]:
    """Each tensor the config leaves for the model file to fill in, with ``need``, the reason
    it may not (``without_gpu``, ``AUTO_COMPLETE_OFF``)."""
    problems: list[str] = []
    for kind, tensors in (("input", config.input), ("output", config.output)):
        if not tensors:
            problems.append(f"it lists no {kind}s")
        problems += [
            f"model {kind} '{tensor.name}' must specify '{field}' for {config.name}"
            for tensor in tensors
            for field in _missing_fields(tensor)
        ]
    return [f"{source}: {problem}; {need}" for problem in problems]


def _missing_fields(tensor: Tensor) -> list[str]:
    missing = []
    if tensor.data_type == DataType.TYPE_INVALID:
        missing.append("data_type")
    if not tensor.dims:
        missing.append("dims")
    return missing
