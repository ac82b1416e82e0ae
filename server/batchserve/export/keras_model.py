"""Keras 3 models (``model.keras``) exported through the PyTorch path, checked against Keras.

Under Keras' torch backend a model *is* a ``torch.nn.Module`` whose weights are torch tensors.
``KerasModel`` puts it behind a forward that takes one tensor per Keras input and returns a
tuple, so tracing, the ONNX checker, verification and publishing are the PyTorch path's, with
the Keras model itself computing the expected numbers. Keras' own
``model.export(..., format="onnx")`` makes the same ``torch.onnx.export`` call under this
backend, but names the outputs after graph nodes (``x.35``) and lets no caller choose output
names, axis names or the opset, which a served config needs.

keras is imported only here, and only when a ``.keras`` file is exported.
"""

from __future__ import annotations

import inspect
import keyword
import os
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from batchserve.core.datatypes import DataType, from_numpy
from batchserve.core.errors import InvalidArgument
from batchserve.export.errors import ExportError, first_line
from batchserve.export.spec import EXPORTABLE_TYPES, InputSpec

BACKEND = "torch"
BATCH_AXIS = "batch"
_INSTALL = "pip install 'batchserve[export]'"


def import_keras() -> ModuleType:
    """keras on the torch backend; chosen here when the user did not choose one.

    KERAS_BACKEND must be set before keras is first imported, and another backend's model is
    no torch module: a different choice is refused rather than overridden.
    """
    chosen = os.environ.get("KERAS_BACKEND")
    if chosen is not None and chosen != BACKEND:
        raise ExportError(
            f"KERAS_BACKEND is '{chosen}': Keras models are exported with the torch backend; "
            "set KERAS_BACKEND=torch or leave it unset"
        )
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = BACKEND
    try:
        import keras  # type: ignore[import-untyped]
    except ImportError:
        raise ExportError(f"exporting a .keras file needs Keras 3: {_INSTALL}") from None
    version = str(keras.__version__)
    if int(version.split(".", 1)[0]) < 3:
        raise ExportError(f"Keras {version} is installed; .keras export needs Keras 3: {_INSTALL}")
    backend = keras.backend.backend()
    if backend != BACKEND:
        raise ExportError(
            f"Keras was already loaded with the {backend} backend in this process; "
            "Keras models are exported with the torch backend (KERAS_BACKEND=torch)"
        )
    module: ModuleType = keras
    return module


def load_keras_model(path: Path) -> Any:
    """The model saved at ``path``, refusing what is not a Keras 3 file before importing keras.

    Loaded with Keras' safe mode on (no arbitrary code from Lambda layers) and not compiled:
    only the forward pass is exported.
    """
    if not path.is_file():
        raise ExportError(f"MODEL {path}: no such file")
    if not zipfile.is_zipfile(path):
        raise ExportError(
            f"MODEL {path} is not a Keras 3 model file (model.save writes a zip archive)"
        )
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            raise ExportError(f"MODEL {path} is not a Keras 3 model file (no config.json in it)")
    keras = import_keras()
    try:
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as exc:
        raise ExportError(
            f"MODEL {path}: Keras cannot load it: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    if not isinstance(model, keras.Model):
        raise ExportError(f"MODEL {path} holds a {type(model).__name__}, not a Keras model")
    return model


class KerasModel(torch.nn.Module):
    """A Keras model as a module whose forward takes one tensor per Keras input, by name.

    ``forward``'s parameters are the Keras input names, so ``--input`` specs bind to them by
    name (or by position) exactly as they bind to a PyTorch module's forward.
    """

    framework = "Keras"
    expected_warnings = (
        # Keras turns static shapes into Python numbers and constants while it is traced, as
        # its own ONNX export does (which hides these); the verification at every tested size
        # is what shows whether the graph generalises.
        "Converting a tensor to a Python integer",
        "Converting a tensor to a Python boolean",
        "torch.as_tensor results are registered as constants",
    )

    def __init__(self, model: Any, input_names: Sequence[str]) -> None:
        super().__init__()
        self.keras_model = model
        self._structure = _input_structure(model)
        parameters = [
            inspect.Parameter(_parameter(name, i), inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for i, name in enumerate(input_names)
        ]

        def forward(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.call_keras(*inputs)

        forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        self.forward = forward

    def call_keras(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The Keras model in inference mode; its outputs flattened as Keras orders them."""
        import keras

        if self._structure is None:
            arguments: object = inputs[0] if len(inputs) == 1 else list(inputs)
        else:
            arguments = keras.tree.pack_sequence_as(self._structure, list(inputs))
        result = self.keras_model(arguments, training=False)
        return tuple(keras.tree.flatten(result))


def keras_model_inputs(model: Any, max_batch_size: int) -> tuple[InputSpec, ...]:
    """The input signature the Keras model declares; ``None`` dims become named axes.

    The first ``None`` is the batch axis (``batch``) when batching; any other is
    ``<input>_dim<i>`` (a name ``--axis-sizes`` can use).
    """
    tensors = _input_tensors(model)
    specs = []
    for index, tensor in enumerate(tensors):
        name = str(tensor.name)
        if not name.isidentifier():
            raise ExportError(
                f"Keras input {index} is named {name!r}, which is not an identifier: name the "
                "inputs with --input"
            )
        dims = tuple(
            _dim(name, axis, size, max_batch_size) for axis, size in enumerate(tensor.shape)
        )
        specs.append(InputSpec(name, _datatype(name, str(tensor.dtype)), dims))
    return tuple(specs)


def keras_input_names(model: Any) -> list[str]:
    """The Keras model's input names, in the order it takes them; empty when it declares none."""
    try:
        return [str(tensor.name) for tensor in model.inputs or ()]
    except (AttributeError, ValueError):
        return []


def keras_output_names(model: Any) -> tuple[str, ...]:
    """What the Keras model calls its outputs, in the order ``KerasModel`` returns them.

    A dict of outputs is flattened in key order, so the keys are the names; a Functional
    model's list of outputs is named after the layers that produce them. Other models (a
    Sequential, a subclassed model) leave the default names, ``output0``, ``output1``, ...
    """
    try:
        structure = model.output
    except (AttributeError, ValueError):
        return ()
    if isinstance(structure, dict):
        return tuple(sorted(str(key) for key in structure))
    names = getattr(model, "output_names", None)
    return tuple(str(name) for name in names) if names else ()


def _input_tensors(model: Any) -> list[Any]:
    tensors = list(model.inputs or ()) if keras_input_names(model) else []
    if not tensors:
        raise ExportError(
            f"the Keras model ({type(model).__name__}) declares no inputs (a subclassed model "
            "does not): give each with --input NAME:DTYPE:DIMS"
        )
    return tensors


def _input_structure(model: Any) -> Any:
    """How a Functional model takes its inputs (a tensor, a list, a dict); None for others."""
    try:
        return model.input
    except (AttributeError, ValueError):
        return None


def _datatype(name: str, dtype: str) -> DataType:
    datatype: DataType | None
    try:
        datatype = from_numpy(np.dtype(dtype))
    except (TypeError, InvalidArgument):
        datatype = None
    if datatype is None or datatype.wire not in EXPORTABLE_TYPES:
        raise ExportError(
            f"Keras input '{name}' is {dtype}, which cannot be exported (use one of "
            f"{', '.join(EXPORTABLE_TYPES)})"
        )
    return datatype


def _dim(name: str, axis: int, size: int | None, max_batch_size: int) -> int | str:
    if size is not None:
        return int(size)
    if axis == 0 and max_batch_size > 0:
        return BATCH_AXIS
    return f"{name}_dim{axis}"


def _parameter(name: str, index: int) -> str:
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"input{index}"
