"""Read an ONNX file's declared inputs and outputs, and where its external data lives,
without starting a runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import onnx

from batchserve.backends.onnx_types import datatype_from_onnx
from batchserve.core.datatypes import DataType
from batchserve.core.errors import ModelConfigError
from batchserve.core.repository_files import UnusableFile, follow_links
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec

ZIPMAP_HINT: Final = (
    " (skl2onnx writes a classifier's probabilities so by default; convert with "
    "options={id(model): {'zipmap': False}} for a tensor of them)"
)


def _datatype(value_info: Any, path: Path) -> DataType:
    if value_info.type.WhichOneof("value") != "tensor_type":
        shown = onnx_type_text(value_info.type)
        hint = ZIPMAP_HINT if shown.startswith("seq(map(") else ""
        raise ModelConfigError(
            f"{path}: '{value_info.name}' is {shown}, not a tensor: batchserve serves tensors "
            f"only, as Triton does{hint}"
        )
    type_name = onnx.TensorProto.DataType.Name(value_info.type.tensor_type.elem_type)
    datatype = datatype_from_onnx(type_name)
    if datatype is None:
        raise ModelConfigError(
            f"{path}: tensor '{value_info.name}' has unsupported type {type_name}"
        )
    return datatype


def onnx_type_text(value_type: Any) -> str:
    """An ONNX value type as ONNX Runtime writes it: ``seq(map(int64,tensor(float)))``."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        element = onnx.TensorProto.DataType.Name(value_type.tensor_type.elem_type)
        return f"tensor({element.lower()})"
    if kind == "sequence_type":
        return f"seq({onnx_type_text(value_type.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(value_type.map_type.key_type).lower()
        return f"map({key},{onnx_type_text(value_type.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({onnx_type_text(value_type.optional_type.elem_type)})"
    return kind or "a value of no declared type"


def _spec(value_info: Any, path: Path) -> TensorSpec:
    dims = value_info.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC for d in dims)
    names = tuple(d.dim_param or None for d in dims)
    return TensorSpec(value_info.name, _datatype(value_info, path), shape, names)


def read_onnx_signature(path: Path) -> ModelSignature:
    """Inputs and outputs declared by an ONNX file; inputs an initializer backs are
    ``defaulted``, not required."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelConfigError(f"{path}: not a readable ONNX model: {exc}") from None
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = tuple(_spec(v, path) for v in graph.input if v.name not in initializers)
    defaulted = tuple(_spec(v, path) for v in graph.input if v.name in initializers)
    outputs = tuple(_spec(v, path) for v in graph.output)
    return ModelSignature(inputs, outputs, defaulted)


def external_data_problems(model_file: Path, label: str) -> list[str]:
    """External tensor data must exist inside the model's version directory."""
    model = onnx.load(str(model_file), load_external_data=False)
    problems = []
    for tensor in _model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            problem = _location_problem(location, model_file.parent)
            if problem is not None:
                problems.append(f"{label}: tensor '{tensor.name}' keeps its data {problem}")
    return problems


def _location_problem(location: str, version_dir: Path) -> str | None:
    if not location or "\0" in location or Path(location).is_absolute():
        return f"at {location!r}, outside the version directory"
    target = version_dir / location
    try:
        outside = not follow_links(target).is_relative_to(follow_links(version_dir))
    except UnusableFile as exc:
        return f"at {location!r}, which {exc}"
    if outside:
        return f"at {location!r}, outside the version directory"
    if not target.is_file():
        return f"in {location!r}, which does not exist"
    return None


def _model_tensors(model: Any) -> Iterator[Any]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Any) -> Iterator[Any]:
    """Tensors held in node attributes, descending into subgraphs (If, Loop, Scan bodies)."""
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for graph in attribute.graphs:
                yield from _graph_tensors(graph)
