"""What a model file declares about its tensors, independent of the runtime that reads it."""

from __future__ import annotations

from dataclasses import dataclass

from batchserve.core.datatypes import DataType

DYNAMIC = -1


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output as the model file declares it.

    Args:
        name: tensor name in the model graph.
        datatype: element type.
        shape: full shape including any batch axis; ``DYNAMIC`` (-1) marks a free axis.
        axis_names: the symbolic name of each free axis (``None`` where fixed or unnamed).
    """

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    axis_names: tuple[str | None, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """The inputs and outputs of a model file, in graph order.

    ``defaulted`` are inputs the file gives a value for (ONNX graph inputs backed by an
    initializer): a config may declare them, ``optional: true`` to let clients omit them.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    defaulted: tuple[TensorSpec, ...] = ()

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def batches_on_first_axis(self) -> bool:
        """True when every tensor has a leading free axis, so the model can take a batch."""
        tensors = self.inputs + self.outputs
        return bool(tensors) and all(t.shape and t.shape[0] == DYNAMIC for t in tensors)
