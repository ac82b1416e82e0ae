"""Config fields that ask for what batchserve does not do: refused at load, naming the field.

A Triton config is accepted as written, so a field batchserve would skip must not be
skipped silently where that changes what clients get: a decoupled model answering once, a
sequence model batched as stateless requests, or a Python model served as
something else. Fields that only tune performance or observability (``response_cache``,
``metric_tags``, ``optimization`` priorities) are ignored: results
do not depend on them. The full list is in the README's config table.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from batchserve.backends.selection import FORMATS
from batchserve.models.decoupled import BUILTIN_BACKENDS
from batchserve.models.ensemble_config import is_ensemble
from batchserve.proto.model_config_pb2 import ModelConfig

_NOT_SUPPORTED = "batchserve does not support"


def unsupported_problems(config: ModelConfig) -> list[str]:
    """One message per field that would otherwise be ignored in a way that changes results."""
    return _runtime_problems(config) + [
        f"field '{field}' {detail}: {_NOT_SUPPORTED} {what} (yet)"
        for field, detail, what in _found(config)
    ]


def _runtime_problems(config: ModelConfig) -> list[str]:
    """A ``runtime`` is a backend library to Triton: one other than the library of the
    backend batchserve runs is refused in Triton's words (its ``backend_model.cc``: one it
    cannot find, or whose name leads out of the backend directory), then batchserve's."""
    runtime = config.runtime
    if not runtime or _own_library(config):
        return []
    ours = f"field 'runtime' is '{runtime}': {_NOT_SUPPORTED} choosing a backend runtime library"
    if os.path.isabs(runtime) or os.path.normpath(runtime).startswith(".."):
        triton = f"backend library name '{runtime}' escapes backend directory"
    else:
        triton = f"unable to find backend library '{runtime}' for model '{config.name}'"
    return [f"{triton} (batchserve: {ours} (yet))"]


def _own_library(config: ModelConfig) -> bool:
    """``runtime`` names the library of the backend batchserve runs for this model, as a
    Triton config may: the default, written out."""
    backends = {config.backend} | {f.backend for f in FORMATS if f.platform == config.platform}
    return config.runtime in {f"libtriton_{backend}.so" for backend in backends if backend}


def _found(config: ModelConfig) -> Iterator[tuple[str, str, str]]:
    decoupled = config.model_transaction_policy.decoupled
    if decoupled and config.backend not in BUILTIN_BACKENDS and not is_ensemble(config):
        yield (
            "model_transaction_policy.decoupled",
            f"is true for backend '{config.backend or config.platform}'",
            "decoupled models other than those of the built-in backends "
            f"({', '.join(BUILTIN_BACKENDS)})",
        )
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling == "sequence_batching":
        yield from _sequence_fields(config)
        yield from _ragged_sequence_fields(config)
    if config.cc_model_filenames:
        yield "cc_model_filenames", "is set", "per-GPU-architecture model files"
    if config.model_operations.op_library_filename:
        yield "model_operations.op_library_filename", "is set", "custom operation libraries"
    if config.model_repository_agents.agents:
        yield "model_repository_agents", "is set", "repository agents"
    yield from _tensor_fields(config)


def _sequence_fields(config: ModelConfig) -> Iterator[tuple[str, str, str]]:
    batching = config.sequence_batching
    if batching.iterative_sequence:
        yield "sequence_batching.iterative_sequence", "is true", "iterative sequences"
    for index, state in enumerate(batching.state):
        field = f"sequence_batching.state[{index}]"
        if state.use_growable_memory:
            yield f"{field}.use_growable_memory", "is true", "growable state buffers"


def _ragged_sequence_fields(config: ModelConfig) -> Iterator[tuple[str, str, str]]:
    """Ragged batching is built for the dynamic batcher: a sequence batch's rows are slots,
    each with its state, which flat inputs and per-request counts do not describe."""
    what = "ragged batching in a sequence model"
    if config.batch_input:
        yield "batch_input", "is set with sequence_batching", what
    if config.batch_output:
        yield "batch_output", "is set with sequence_batching", what
    for tensor in config.input:
        if tensor.allow_ragged_batch:
            yield "input.allow_ragged_batch", f"is true for input '{tensor.name}'", what


def _tensor_fields(config: ModelConfig) -> Iterator[tuple[str, str, str]]:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            where = f"{kind} '{tensor.name}'"
            if tensor.is_shape_tensor:
                yield f"{kind}.is_shape_tensor", f"is true for {where}", "shape tensors"
            if tensor.is_non_linear_format_io:
                yield (
                    f"{kind}.is_non_linear_format_io",
                    f"is true for {where}",
                    "non-linear tensor formats",
                )
