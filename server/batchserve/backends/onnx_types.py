"""ONNX's element types as batchserve's DataType, from one table.

An ONNX file names a tensor's type by ``onnx.TensorProto``'s enum ("FLOAT"); ONNX Runtime's
session spells the same type ``tensor(float)``. Both are read through ``_WIRE_BY_ONNX``, so
a type the server supports is supported the same way whether it was read from the file or
from the session.
"""

from __future__ import annotations

from typing import Final

from batchserve.core.datatypes import BY_WIRE, DataType

# onnx.TensorProto's type names -> protocol datatype names.
_WIRE_BY_ONNX: Final = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
    "INT8": "INT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "FLOAT16": "FP16",
    "FLOAT": "FP32",
    "DOUBLE": "FP64",
    "STRING": "BYTES",
    "BFLOAT16": "BF16",
}
_BY_ONNX_NAME: Final = {name: BY_WIRE[wire] for name, wire in _WIRE_BY_ONNX.items()}
# ONNX Runtime's NodeArg.type is the lower-case TensorProto name inside "tensor(...)".
_BY_ORT_TYPE: Final = {f"tensor({name.lower()})": dt for name, dt in _BY_ONNX_NAME.items()}


def datatype_from_onnx(type_name: str) -> DataType | None:
    """The DataType of a ``TensorProto.DataType`` name ("FLOAT"); None when unsupported."""
    return _BY_ONNX_NAME.get(type_name)


def datatype_from_ort(type_string: str) -> DataType | None:
    """The DataType of an ONNX Runtime type string ("tensor(float)"); None when unsupported,
    sequences and maps included."""
    return _BY_ORT_TYPE.get(type_string)
