"""BF16 tensors for ONNX Runtime, which batchserve carries as uint16 (numpy has no bfloat16).

ORT's Python binding types a numpy array by its dtype, so a uint16 array meets a bfloat16
input as ``tensor(uint16)`` and is refused, and ``OrtValue.numpy()`` refuses a bfloat16
output. The same bits are handed to ORT under its own type here, and read back as uint16.
Only models with a BF16 tensor come this way (``OnnxBackend`` binds their I/O, ``onnx_io``);
every other model keeps ``session.run``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto

from batchserve.core.datatypes import DataType
from batchserve.core.signature import ModelSignature


def bf16_names(signature: ModelSignature) -> frozenset[str]:
    """The model's BF16 inputs and outputs, by name."""
    tensors = (*signature.inputs, *signature.outputs)
    return frozenset(t.name for t in tensors if t.datatype.wire == "BF16")


def element_type(datatype: DataType) -> Any:
    """The element type ``bind_input``/``bind_output`` take: ONNX's enum for BF16, else numpy's."""
    return TensorProto.BFLOAT16 if datatype.wire == "BF16" else datatype.numpy


def bf16_value(array: np.ndarray) -> Any:
    """A uint16 array's bits as a bfloat16 ``OrtValue`` over the same (contiguous) memory,
    which the caller keeps alive until the run ends."""
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, TensorProto.BFLOAT16)


def bf16_array(value: Any) -> np.ndarray:
    """A bfloat16 ``OrtValue`` in host memory as its bits in uint16: one copy of its bytes,
    as ``numpy()`` makes for the other types."""
    array = np.empty(value.shape(), np.uint16)
    if array.nbytes:  # an empty tensor may have no buffer at all
        ctypes.memmove(array.ctypes.data, value.data_ptr(), array.nbytes)
    return array
