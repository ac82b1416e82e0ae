"""Checking a request against the model it is addressed to.

Everything here reads only a tensor's name, datatype and shape, never its data: the full
decoders call ``check_request`` before decoding any element (``deferred.py``), so that a
request the model refuses costs nothing in proportion to its size. The codecs check that
each tensor is self-consistent (shape against data); this module checks it against the
model's configuration, once for both protocols.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from batchserve.core.datatypes import DataType, from_config
from batchserve.core.errors import InvalidArgument
from batchserve.core.lru import LruCache
from batchserve.core.response_parameters import NONE, response_parameters
from batchserve.core.types import RequestedOutput, Tensor, Verdict
from batchserve.proto.model_config_pb2 import ModelConfig

LAYOUTS = 256
"""Valid request layouts remembered per model version."""
_GENERATIONS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """Validated arrays, keyed by input name, and what to send back."""

    inputs: dict[str, np.ndarray]
    batch_size: int
    output_names: tuple[str, ...]


SchemaLookup = Callable[[], "RequestSchema"]
"""The schema of the model a request names, looked up only when a decoder needs it (a
repeated layout never does); raises as the lookup of the model does (unknown, not ready)."""


def _dims_text(dims: Sequence[int], separator: str = ", ") -> str:
    """A shape as batchserve writes it, ``[-1, 1, 8, 8]``; with ``separator=","`` as Triton's
    ``DimsListToString`` does, ``[-1,1,8,8]``."""
    return "[" + separator.join(str(d) for d in dims) + "]"


@dataclass(frozen=True, slots=True)
class InputRule:
    """One configured input, in plain Python: reading protobuf fields costs microseconds."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    """The full expected shape, with -1 for the batch axis and any variable dimension."""
    optional: bool


@dataclass(frozen=True, slots=True)
class RequestSchema:
    """What a request to one model must look like, compiled once when the model loads.

    Validating against the ``ModelConfig`` message directly cost ~30 µs a request (each
    repeated-field walk builds new wrapper objects); against this, a few µs. ``passed``
    remembers the request layouts (``InferRequest.layout``) that were found valid, with the
    batch size and outputs they imply: a repeat skips the checks.
    """

    model: str
    inputs: tuple[InputRule, ...]
    input_names: frozenset[str]
    outputs: tuple[str, ...]
    max_batch_size: int
    passed: LruCache[Hashable, tuple[int, tuple[str, ...]]] = field(
        default_factory=lambda: LruCache(LAYOUTS), compare=False, repr=False
    )
    generation: int = field(default_factory=lambda: next(_GENERATIONS), compare=False)
    """Tells schemas of the same model apart across processes: a worker validated a
    request against this very schema when it names this generation."""
    response_parameters: Mapping[str, object] = field(default_factory=lambda: NONE, compare=False)
    """Parameters every response carries, from the config (``core/response_parameters.py``)."""

    @classmethod
    def of(cls, config: ModelConfig) -> RequestSchema:
        batched = config.max_batch_size > 0
        rules = tuple(
            InputRule(
                spec.name,
                from_config(spec.data_type),
                ((-1,) if batched else ()) + tuple(spec.dims),
                spec.optional,
            )
            for spec in config.input
        )
        return cls(
            model=config.name,
            inputs=rules,
            input_names=frozenset(rule.name for rule in rules),
            outputs=tuple(spec.name for spec in config.output),
            max_batch_size=config.max_batch_size,
            response_parameters=response_parameters(config),
        )


def _check_input(tensor: Tensor, rule: InputRule, schema: RequestSchema) -> None:
    """A wrong datatype, a wrong shape and a batch over ``max_batch_size`` are told in Triton
    core's text first (``InferenceRequest::Normalize``), which clients and tests match, then
    batchserve's plainer one. The datatype text is the current release's, which names the
    input; older ones said "inference input data-type is 'X', model expects 'Y' for 'M'"."""
    if tensor.datatype is not rule.datatype:
        given, wanted = tensor.datatype.wire, rule.datatype.wire
        raise InvalidArgument(
            f"inference input '{tensor.name}' data-type is '{given}', but model "
            f"'{schema.model}' expects '{wanted}' (batchserve: input '{tensor.name}': "
            f"datatype {given} does not match the model's {wanted})"
        )
    expected, shape = rule.dims, tensor.shape
    if len(shape) != len(expected) or any(
        e != -1 and e != s for e, s in zip(expected, shape, strict=True)
    ):
        raise InvalidArgument(
            f"unexpected shape for input '{tensor.name}' for model '{schema.model}'. Expected "
            f"{_dims_text(expected, ',')}, got {_dims_text(shape, ',')} (batchserve: input "
            f"'{tensor.name}': shape {_dims_text(shape)} does not match the model's "
            f"{_dims_text(expected)}, where -1 is any size)"
        )
    max_batch = schema.max_batch_size
    if max_batch > 0 and not 1 <= shape[0] <= max_batch:
        plain = (
            f"input '{tensor.name}': batch size {shape[0]} is outside 1..{max_batch}, the "
            "model's max_batch_size"
        )
        if shape[0] < 1:  # Triton has no text of its own for this one
            raise InvalidArgument(plain)
        raise InvalidArgument(
            f"inference request batch-size must be <= {max_batch} for '{schema.model}' "
            f"(batchserve: {plain})"
        )


def _index_inputs(inputs: Sequence[Tensor], schema: RequestSchema) -> dict[str, Tensor]:
    by_name: dict[str, Tensor] = {}
    for tensor in inputs:
        if tensor.name in by_name:
            raise InvalidArgument(f"input '{tensor.name}' appears more than once")
        if tensor.name not in schema.input_names:
            raise InvalidArgument(
                f"unexpected input '{tensor.name}': model '{schema.model}' takes "
                f"{sorted(schema.input_names)}"
            )
        by_name[tensor.name] = tensor
    return by_name


def _missing_message(schema: RequestSchema, given: list[str], missing: list[str]) -> str:
    """Triton core's text (``InferenceRequest::ValidateRequestInputs``), which clients and
    tests match, then batchserve's plainer one."""
    total = len(schema.inputs)
    required = sum(not rule.optional for rule in schema.inputs)
    expected = (
        f"expected {total} inputs"
        if required == total
        else f"expected number of inputs between {required} and {total}"
    )
    got = "[" + ",".join(f"'{name}'" for name in given) + "]"
    lacking = "[" + ",".join(f"'{name}'" for name in missing) + "]"
    plain = ", ".join(f"'{name}'" for name in missing)
    return (
        f"{expected} but got {len(given)} inputs for model '{schema.model}'. Got input(s) "
        f"{got}, but missing required input(s) {lacking}. Please provide all required "
        f"input(s). (missing input {plain} of model '{schema.model}')"
    )


def _batch_size(tensors: Sequence[Tensor], schema: RequestSchema) -> int:
    if schema.max_batch_size <= 0 or not tensors:
        return 1
    sizes = {t.shape[0] for t in tensors}
    if len(sizes) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size: {sorted(sizes)}")
    return sizes.pop()


def _output_names(
    requested: Sequence[RequestedOutput] | None, schema: RequestSchema
) -> tuple[str, ...]:
    known = schema.outputs
    if not requested:
        return known
    names = tuple(output.name for output in requested)
    if len(set(names)) != len(names):
        raise InvalidArgument(f"an output is requested more than once: {list(names)}")
    for name in names:
        if name not in known:
            raise InvalidArgument(  # Triton's words (model.cc), which L0_output_name reads
                f"unexpected inference output '{name}' for model '{schema.model}' "
                f"(batchserve: the model produces {list(known)})"
            )
    return names


def check_request(
    inputs: Sequence[Tensor], outputs: Sequence[RequestedOutput] | None, schema: RequestSchema
) -> Verdict:
    """Every input present once, typed and shaped as configured; outputs known. Reads no
    tensor's data, so the decoders call it before decoding any."""
    batch_size, output_names = _check(inputs, outputs, schema)
    return Verdict(schema, batch_size, output_names)


def validate_request(
    inputs: Sequence[Tensor],
    outputs: Sequence[RequestedOutput] | None,
    schema: RequestSchema | ModelConfig,
    layout: Hashable | None = None,
    verdict: Verdict | None = None,
) -> ValidRequest:
    """``check_request``, unless a ``layout`` (``InferRequest.layout``) passed before or the
    decoder's ``verdict`` is for this very schema."""
    if not isinstance(schema, RequestSchema):
        schema = RequestSchema.of(schema)
    if layout is not None:
        known = schema.passed.get(layout)
        if known is not None:
            return ValidRequest({tensor.name: tensor.data for tensor in inputs}, *known)
    if verdict is not None and verdict.schema is schema:
        found = (verdict.batch_size, verdict.output_names)
    else:
        found = _check(inputs, outputs, schema)
    if layout is not None:
        schema.passed.put(layout, found)
    return ValidRequest({tensor.name: tensor.data for tensor in inputs}, *found)


def _check(
    inputs: Sequence[Tensor], outputs: Sequence[RequestedOutput] | None, schema: RequestSchema
) -> tuple[int, tuple[str, ...]]:
    by_name = _index_inputs(inputs, schema)
    missing = [
        rule.name for rule in schema.inputs if not rule.optional and rule.name not in by_name
    ]
    if missing:
        raise InvalidArgument(_missing_message(schema, list(by_name), missing))
    for rule in schema.inputs:
        tensor = by_name.get(rule.name)
        if tensor is not None:
            _check_input(tensor, rule, schema)
    return _batch_size(list(by_name.values()), schema), _output_names(outputs, schema)
