"""config.pbtxt <-> the protobuf ModelConfig message (Triton's text format), and its completion.

Parsing uses protobuf's own text format against ``inference.ModelConfig``, the
same message the gRPC ModelConfig call returns, so there is one schema.
Completion fills what the model file already says, so the smallest valid entry
is just the model file; checking the result is ``batchserve.models.config_validation``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, TypeVar

from google.protobuf import text_format
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from batchserve.backends.selection import ModelFormat
from batchserve.core.backend_config import BackendConfig, default_max_batch_size
from batchserve.core.datatypes import config_name
from batchserve.core.errors import ModelConfigError
from batchserve.core.repository_files import UnusableFile, read_regular_file
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.devices.placement import group_name
from batchserve.models.batch_io_config import batch_input_targets
from batchserve.proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
    ModelVersionPolicy,
)
from batchserve.scheduler.sequences import DEFAULT_IDLE_US

CONFIG_FILENAME = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20  # Triton's largest configs (long ensembles) are a few KiB

DEFAULT_MAX_BATCH_SIZE: Final = 32
"""max_batch_size given to a model whose config leaves it 0 while every tensor has a leading
dynamic axis. Above Triton's default of 4, so that the memory budget measured at load time,
not this number, is what normally caps a batch."""

_QUOTE_LIMIT = 60
# protobuf's ParseError text: "line:col : 'source line': problem" (the quote is optional).
_PARSE_ERROR = re.compile(r"(?P<at>\d+:\d+ : )'(?P<quote>.*)': (?P<problem>.*)", re.DOTALL)

_Tensor = TypeVar("_Tensor", ModelInput, ModelOutput)


def _readable(error: text_format.ParseError) -> str:
    """protobuf's message, with a long quoted source line cut around the column at fault."""
    message = str(error)
    match = _PARSE_ERROR.fullmatch(message)
    if match and len(match["quote"]) > _QUOTE_LIMIT:
        quote = _excerpt(match["quote"], error.GetColumn() or 1)
        message = f"{match['at']}'{quote}': {match['problem']}"
    if 'Enum type "inference.DataType"' in message:
        names = ", ".join(config_name(v) for v in DataType.values() if v)
        message += f" Expected one of {names}."
    return message


def _excerpt(line: str, column: int) -> str:
    start = max(0, min(column - _QUOTE_LIMIT // 2, len(line) - _QUOTE_LIMIT))
    end = start + _QUOTE_LIMIT
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")


def parse_pbtxt(text: str, *, source: str = CONFIG_FILENAME) -> ModelConfig:
    """Parse config.pbtxt text; errors name the file, line and field at fault."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {_readable(exc)}") from None
    return config


def read_pbtxt_text(path: Path, *, source: str) -> str:
    """A config.pbtxt's text: a regular file of at most MAX_CONFIG_BYTES, as text parsing
    holds the GIL for as long as the file is large."""
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES, CONFIG_FILENAME)
    except UnusableFile as exc:
        raise ModelConfigError(f"{source}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{source}: cannot read: {exc}") from None


def load_pbtxt(path: Path) -> ModelConfig:
    """Read and parse a config.pbtxt file."""
    return parse_pbtxt(read_pbtxt_text(path, source=str(path)), source=str(path))


def to_pbtxt(config: ModelConfig) -> str:
    """Render a ModelConfig as config.pbtxt text."""
    return str(text_format.MessageToString(config, use_short_repeated_primitives=True))


def _config_dims(spec: TensorSpec, batched: bool) -> list[int]:
    dims = spec.shape[1:] if batched else spec.shape
    return [d if d >= 0 else DYNAMIC for d in dims]


def config_from_signature(name: str, signature: ModelSignature, max_batch_size: int) -> ModelConfig:
    """A minimal ModelConfig describing a model file; dims drop the batch axis when batching."""
    config = ModelConfig(name=name, max_batch_size=max_batch_size)
    _complete_tensors(config.input, signature.inputs, max_batch_size > 0)
    _complete_tensors(config.output, signature.outputs, max_batch_size > 0)
    return config


def model_dims(tensor: ModelInput | ModelOutput) -> list[int]:
    """The shape the model itself sees: ``reshape.shape`` when given, else ``dims``."""
    return list(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)


def version_policy(config: ModelConfig) -> ModelVersionPolicy:
    """The config's version policy, or Triton's default: the latest version only."""
    if config.version_policy.WhichOneof("policy_choice") is not None:
        return config.version_policy
    return ModelVersionPolicy(latest=ModelVersionPolicy.Latest(num_versions=1))


def complete_config(
    config: ModelConfig,
    *,
    name: str,
    model_format: ModelFormat,
    signature: ModelSignature | None,
    backend_config: BackendConfig | None = None,
) -> ModelConfig:
    """A copy of ``config`` with every field the server needs filled in; a batchable
    model's batch size from Triton's ``--backend-config`` ``default-max-batch-size`` where
    ``backend_config`` sets it.

    ``signature`` None (a TensorRT plan read without a GPU) leaves the tensors as written.
    proto3 cannot tell ``max_batch_size: 0`` from an absent field, so 0 counts as unset
    and the signature decides; see ``_complete_batching``.
    """
    done = ModelConfig()
    done.CopyFrom(config)
    done.name = done.name or name
    done.platform = done.platform or model_format.platform
    done.backend = done.backend or model_format.backend
    if signature is not None:
        batch = default_max_batch_size(backend_config or {}, done.backend, DEFAULT_MAX_BATCH_SIZE)
        _complete_batching(done, signature, batch)
        batched = done.max_batch_size > 0
        computed = batch_input_targets(done)  # the batcher's, not the clients'
        inputs = tuple(spec for spec in signature.inputs if spec.name not in computed)
        _complete_tensors(done.input, inputs, batched, signature.defaulted)
        _complete_tensors(done.output, signature.outputs, batched)
    _complete_instances(done)
    # Triton's AutoCompleteBackendFields names the file whether or not completion is on
    done.default_model_filename = done.default_model_filename or model_format.default_filename
    done.version_policy.CopyFrom(version_policy(done))
    _normalize(done)
    return done


def _normalize(config: ModelConfig) -> None:
    """The defaults Triton's NormalizeModelConfig writes into every served config, each one
    what batchserve does when the field is unset, so that clients and tools reading the config
    see Triton's: a batching model's scheduler prefers ``max_batch_size`` (a full batch goes
    at once either way), a sequence is released after Triton's idle time, and inputs and
    outputs go through pinned host memory (on a GPU batchserve always stages them there)."""
    biggest = [config.max_batch_size] if config.max_batch_size > 0 else []
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
        config.dynamic_batching.preferred_batch_size.extend(biggest)
    if config.HasField("sequence_batching"):
        sequences = config.sequence_batching
        if not sequences.max_sequence_idle_microseconds:
            sequences.max_sequence_idle_microseconds = DEFAULT_IDLE_US
        if sequences.HasField("oldest") and not sequences.oldest.preferred_batch_size:
            sequences.oldest.preferred_batch_size.extend(biggest)
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _complete_batching(config: ModelConfig, signature: ModelSignature, batch: int) -> None:
    """Give a batchable model ``batch`` as its batch size and dynamic batching, as Triton
    does (a ``batch`` of 0 leaves it unbatched, as Triton's default-max-batch-size 0 does).

    Left at 0 when the model has a fixed leading axis, or when the config writes some tensor's
    dims with the model's full rank: that config describes the batch axis itself.
    """
    if config.max_batch_size != 0 or not signature.batches_on_first_axis():
        return
    if _writes_full_rank(config.input, signature.inputs) or _writes_full_rank(
        config.output, signature.outputs
    ):
        return
    if batch <= 0:
        return
    config.max_batch_size = batch
    if config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()


def _writes_full_rank(
    listed: RepeatedCompositeFieldContainer[_Tensor], specs: tuple[TensorSpec, ...]
) -> bool:
    ranks = {spec.name: len(spec.shape) for spec in specs}
    for tensor in listed:
        dims = model_dims(tensor)
        if dims and len(dims) == ranks.get(tensor.name):
            return True
    return False


def _complete_tensors(
    listed: RepeatedCompositeFieldContainer[_Tensor],
    specs: tuple[TensorSpec, ...],
    batched: bool,
    defaulted: tuple[TensorSpec, ...] = (),
) -> None:
    """List every required model tensor when the config lists none; fill unset types and
    dims (``defaulted`` inputs too, when the config declares them)."""
    if not listed:
        for new in specs:
            listed.add(name=new.name)
    by_name = {spec.name: spec for spec in specs + defaulted}
    for tensor in listed:
        spec = by_name.get(tensor.name)
        if spec is None:
            continue
        if tensor.data_type == DataType.TYPE_INVALID:
            tensor.data_type = DataType.ValueType(spec.datatype.config)
        if not tensor.dims and not tensor.HasField("reshape"):
            # Nothing per sample (a batching model's [-1]) or a scalar: dims [1], as Triton's
            # backends complete them; a batching model's is reshaped back to nothing, and a
            # scalar is one by Triton's rule (``backends.reshape.scalar_reshapes``).
            dims = _config_dims(spec, batched)
            tensor.dims.extend(dims or [1])
            if not dims and batched:
                tensor.reshape.SetInParent()


def _complete_instances(config: ModelConfig) -> None:
    """One instance by default; a group's ``count: 0`` is proto3's "unset", so it means 1.

    Groups are named as Triton's NormalizeModelConfig names them: a group it adds takes the
    model's name, a listed group without one ``<model>_<index>``; tools that read the served
    config (Model Analyzer among them) expect a name on every group.
    """
    if not config.instance_group:
        config.instance_group.add(name=config.name, count=1, kind=ModelInstanceGroup.KIND_AUTO)
    for index, group in enumerate(config.instance_group):
        group.name = group_name(config, group, index)
        if group.count == 0:
            group.count = 1
