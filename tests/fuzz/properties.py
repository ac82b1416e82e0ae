"""The property every fuzz target checks: untrusted input either decodes to a request that is
consistent with itself (and, when it validates, with the model) or is refused with
InvalidArgument, the family every 4xx / INVALID_ARGUMENT answer comes from. Any other
exception would reach the client as a 500, and an array far larger than the input that
described it would be a way to exhaust the server's memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from batchserve.core.datatypes import from_config
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestedOutput, Tensor
from batchserve.core.validation import ValidRequest, validate_request
from batchserve.dataplane.classification import requested_counts
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig

# Models of each shape of signature validation knows: fixed dims with a batch axis, a
# sequence model, no batch axis with an optional input, and the 2-byte float types.
CONFIGS: Final[tuple[ModelConfig, ...]] = tuple(
    parse_pbtxt(text)
    for text in (
        """name: "fixed" max_batch_size: 8
           input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
           output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]""",
        """name: "seq" max_batch_size: 4
           input [{ name: "tokens" data_type: TYPE_INT64 dims: [-1] },
                  { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
           output [{ name: "logits" data_type: TYPE_FP32 dims: [-1, 3] }]
           dynamic_batching {}
           batchserve { sequence_length_input: "lengths" }""",
        """name: "text" max_batch_size: 0
           input [{ name: "text" data_type: TYPE_STRING dims: [-1] },
                  { name: "mask" data_type: TYPE_BOOL dims: [2, 2] optional: true }]
           output [{ name: "label" data_type: TYPE_STRING dims: [1] }]""",
        """name: "half" max_batch_size: 2
           input [{ name: "h" data_type: TYPE_FP16 dims: [2] },
                  { name: "b" data_type: TYPE_BF16 dims: [-1, 1] }]
           output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]""",
    )
)
INPUT_NAMES: Final = sorted({spec.name for c in CONFIGS for spec in c.input})
OUTPUT_NAMES: Final = sorted({spec.name for c in CONFIGS for spec in c.output})
SLACK: Final = 64
"""Bytes a decoded request may hold beyond 8 per input byte (an empty body, say)."""


def check_decoded(inputs: Sequence[Tensor], source_bytes: int) -> None:
    """Each array is what its tensor says, and all of them fit in 8 bytes per input byte
    (an FP64 or object element takes 8 bytes; the shortest JSON element takes two)."""
    total = 0
    for tensor in inputs:
        assert tensor.data.shape == tensor.shape, tensor.name
        assert tensor.data.dtype == tensor.datatype.numpy, tensor.name
        if "shared_memory_region" in tensor.parameters:  # a one-element placeholder
            assert tensor.data.base is not None, tensor.name
            assert tensor.data.base.size == 1, tensor.name
            continue
        total += tensor.data.nbytes
    assert total <= 8 * source_bytes + SLACK, f"{total} bytes decoded from {source_bytes}"


def check_valid(valid: ValidRequest, config: ModelConfig) -> None:
    """A validated request carries exactly what the model takes, batch sizes agreeing."""
    batched = config.max_batch_size > 0
    specs = {spec.name: spec for spec in config.input}
    assert set(valid.inputs) <= set(specs)
    assert {s.name for s in config.input if not s.optional} <= set(valid.inputs)
    for name, array in valid.inputs.items():
        spec = specs[name]
        assert array.dtype == from_config(spec.data_type).numpy, name
        dims = ([-1] if batched else []) + list(spec.dims)
        assert len(array.shape) == len(dims), name
        assert all(d in (-1, s) for d, s in zip(dims, array.shape, strict=True)), name
        if batched:
            assert array.shape[0] == valid.batch_size, name
    assert 1 <= valid.batch_size <= max(config.max_batch_size, 1)
    assert valid.output_names
    assert set(valid.output_names) <= {spec.name for spec in config.output}


def check_against_models(
    inputs: Sequence[Tensor], outputs: Sequence[RequestedOutput] | None
) -> None:
    """Validating against each model either refuses with InvalidArgument or is consistent."""
    for config in CONFIGS:
        try:
            valid = validate_request(inputs, outputs, config)
        except InvalidArgument:
            continue
        check_valid(valid, config)
        check_classification(outputs, config)


def check_classification(outputs: Sequence[RequestedOutput] | None, config: ModelConfig) -> None:
    """A classification request names a numeric output of the model, with k >= 1."""
    types = {spec.name: from_config(spec.data_type) for spec in config.output}
    try:
        counts = requested_counts(outputs, types)
    except InvalidArgument:
        return
    assert all(k >= 1 and types[name].wire != "BYTES" for name, k in counts.items())
