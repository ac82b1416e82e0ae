"""An inference request as the caller gave it, checked and encoded once for either protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Union

import numpy.typing as npt

from batchserve_client.errors import InvalidArgument
from batchserve_client.tensors import Array, prepare

ParameterValue = Union[bool, int, float, str]  # noqa: UP007 - a runtime alias on Python 3.10
# Request parameters that have arguments of their own.
_RESERVED: Final = ("priority", "timeout", "binary_data_output")


@dataclass(frozen=True, slots=True)
class InferInput:
    """One input: its name, wire datatype and the array in that datatype's dtype."""

    name: str
    datatype: str
    array: Array


@dataclass(frozen=True, slots=True)
class InferRequest:
    """Everything one inference sends; outputs empty means every output."""

    model: str
    version: str
    inputs: tuple[InferInput, ...]
    outputs: tuple[str, ...]
    id: str
    parameters: Mapping[str, ParameterValue]


def build_request(
    model: str,
    inputs: Mapping[str, npt.ArrayLike],
    *,
    outputs: Sequence[str] | None = None,
    version: str = "",
    request_id: str = "",
    priority: int = 0,
    queue_timeout: float | None = None,
    parameters: Mapping[str, ParameterValue] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> InferRequest:
    """Check the arguments of ``infer`` and convert the inputs to their wire dtypes."""
    if not inputs:
        raise InvalidArgument(f"model '{model}': an inference needs at least one input")
    types = dict(datatypes or {})
    for name in types.keys() - inputs.keys():
        raise InvalidArgument(f"datatypes names '{name}', which is not one of the inputs")
    prepared = tuple(
        InferInput(name, *prepare(value, types.get(name), name=name))
        for name, value in inputs.items()
    )
    names = (outputs,) if isinstance(outputs, str) else tuple(outputs or ())
    return InferRequest(
        model,
        version,
        prepared,
        names,
        request_id,
        _parameters(priority, queue_timeout, parameters),
    )


def _parameters(
    priority: int, queue_timeout: float | None, extra: Mapping[str, ParameterValue] | None
) -> dict[str, ParameterValue]:
    parameters = dict(extra or {})
    for key in _RESERVED:
        if key in parameters:
            raise InvalidArgument(f"request parameter '{key}' is set by its own argument")
    if priority < 0:
        raise InvalidArgument(f"priority must be >= 0, got {priority}")
    if priority:
        parameters["priority"] = priority
    if queue_timeout is not None:
        if queue_timeout <= 0:
            raise InvalidArgument(f"queue_timeout must be > 0 seconds, got {queue_timeout}")
        parameters["timeout"] = max(1, round(queue_timeout * 1_000_000))  # microseconds
    return parameters
