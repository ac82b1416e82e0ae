"""What the calls return: plain frozen values, the same whichever protocol carried them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchserve_client.tensors import Array


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The server's name, version and the protocol extensions it supports."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output of a model; -1 marks a dimension of variable size."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """A model's versions, platform and signature."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, eq=False)  # numpy arrays have no single truth value to compare by
class InferResult(Mapping[str, Array]):
    """The outputs of one inference, by name, as numpy arrays.

    Arrays decoded from binary data are read-only views of the response (no copy):
    call ``.copy()`` on one to modify it.

    Args:
        outputs: output name to array, in the order the server sent them.
        model_name: the model that answered.
        model_version: the version that answered.
        id: the request id, echoed by the server.
        parameters: response parameters, if the server sent any.
    """

    outputs: Mapping[str, Array]
    model_name: str
    model_version: str
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Array:
        return self.outputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)
