"""Triton's raw binary request: a body with no JSON header is the model's one input.

Rules as Triton's core applies them (``InferenceRequest::Normalize``): the model must
have exactly one input; its name, datatype and shape come from the model configuration,
with a batch of 1 prepended when the model batches; one variable-size dimension (-1) is
deduced from the body's size; a BYTES input must have shape [1] and the whole body is its
single element. Outputs are sent as binary data, as Triton does for these requests.
"""

from __future__ import annotations

import math

import numpy as np

from batchserve.core.datatypes import from_config
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import InputDataError, array_from_bytes, checked_shape
from batchserve.core.types import InferRequest, Tensor
from batchserve.proto.model_config_pb2 import ModelConfig

WILDCARD = -1


def raw_shape(config: ModelConfig, body_size: int) -> tuple[int, ...]:
    """The input's shape: the configured dims (batch of 1 first when the model batches),
    with its one variable dimension deduced from ``body_size``."""
    spec = config.input[0]
    dims = list(spec.dims)
    variable = [index for index, dim in enumerate(dims) if dim == WILDCARD]
    if len(variable) > 1:
        raise InvalidArgument(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are "
            "more than one variable-sized dimension (batchserve: send a JSON header with the "
            "shape)"
        )
    if variable:
        fixed = math.prod(dim for dim in dims if dim != WILDCARD)
        itemsize = from_config(spec.data_type).itemsize
        dims[variable[0]] = body_size // (fixed * itemsize) if fixed and itemsize else 0
    batch = [1] if config.max_batch_size > 0 else []
    return checked_shape(batch + dims, tensor=spec.name)


def raw_request(body: bytes, config: ModelConfig, model: str, version: str) -> InferRequest:
    """The request a raw binary body makes for the model ``config`` describes."""
    if len(config.input) != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} inputs in '{model}' model configuration (batchserve: an "
            "Inference-Header-Content-Length of 0 makes the body the one input; send a JSON "
            "header for this model)"
        )
    spec = config.input[0]
    datatype = from_config(spec.data_type)
    if datatype.wire == "BYTES":
        if any(dim != 1 for dim in spec.dims):
            raise InvalidArgument(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
        shape = ((1,) if config.max_batch_size > 0 else ()) + tuple(spec.dims)
        data = np.array([body], dtype=object).reshape(shape)
    else:
        shape = raw_shape(config, len(body))
        try:
            data = array_from_bytes(body, datatype, shape, tensor=spec.name)
        except InputDataError as mismatch:
            raise mismatch.for_model(model) from None
    return InferRequest(
        model_name=model,
        model_version=version,
        inputs=[Tensor(spec.name, datatype, shape, data)],
        binary_output=True,
        protocol="http",
    )
