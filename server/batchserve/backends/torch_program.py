"""What a ``torch.export`` program takes and gives: names, element types, shapes.

Inputs are named by ``forward``'s parameters (keyword-only inputs by their keyword). Outputs
are named by the keys of the dict ``forward`` returns (``batchserve export`` writes programs
that return one, keyed by ``--output``), else ``OUTPUT__0``, ``OUTPUT__1``, ... in order, as
Triton's PyTorch backend names them. Every input and output must be a tensor: nested
tuples, lists or dicts are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.backends.torch_archive import load_program
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import ModelConfigError
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec

ORDINAL_OUTPUT = "OUTPUT__{}"
_WIRE_BY_TORCH = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


@dataclass(frozen=True, slots=True)
class ProgramLayout:
    """How the server calls a program and reads its answer.

    Args:
        signature: inputs and outputs, shapes with DYNAMIC for symbolic sizes.
        positional: inputs passed by position, in ``forward``'s order.
        keywords: inputs passed by keyword.
        outputs_by_key: outputs come back as a dict (by name) rather than a sequence.
        batch_limit: the most rows the program's batch axis accepts (its ``Dim`` maximum);
            None when unbounded or when inputs have no dynamic leading axis.
    """

    signature: ModelSignature
    positional: tuple[str, ...]
    keywords: tuple[str, ...]
    outputs_by_key: bool
    batch_limit: int | None


def read_pt2_signature(model_file: Path) -> ModelSignature:
    """The signature of a ``model.pt2``, read through the checked loader."""
    return describe(load_program(model_file), model_file).signature


def describe(program: Any, model_file: Path) -> ProgramLayout:
    """The layout of a loaded ``ExportedProgram``; ModelConfigError for unservable ones."""
    call = program.module_call_graph[0].signature
    positional, keywords = _input_names(call, program, model_file)
    output_names, by_key = _output_names(call.out_spec, model_file)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = [placeholders[name] for name in program.graph_signature.user_inputs]
    returned = _returned_nodes(program)
    if len(user_inputs) != len(positional) + len(keywords) or len(returned) != len(output_names):
        raise ModelConfigError(f"{model_file}: the program's call spec does not match its graph")
    inputs = tuple(
        _spec(name, node, model_file)
        for name, node in zip((*positional, *keywords), user_inputs, strict=True)
    )
    outputs = tuple(
        _spec(name, node, model_file) for name, node in zip(output_names, returned, strict=True)
    )
    limit = _batch_limit(program, user_inputs)
    return ProgramLayout(ModelSignature(inputs, outputs), positional, keywords, by_key, limit)


def _input_names(
    call: Any, program: Any, model_file: Path
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    spec = call.in_spec
    args, kwargs = spec.children() if spec.num_children == 2 else (spec, None)
    leaves = [*args.children(), *(kwargs.children() if kwargs is not None else ())]
    if not all(child.is_leaf() for child in leaves):
        raise ModelConfigError(
            f"{model_file}: forward takes nested inputs (tuples, lists or dicts of tensors); "
            "batchserve serves programs whose inputs are tensors"
        )
    names = list(call.forward_arg_names or program.graph_signature.user_inputs)
    positional = tuple(names[: args.num_children])
    keywords = tuple(str(key) for key in (kwargs.context if kwargs is not None else ()))
    if len(positional) != args.num_children:
        raise ModelConfigError(f"{model_file}: the program does not name its inputs")
    return positional, keywords


def _output_names(spec: Any, model_file: Path) -> tuple[tuple[str, ...], bool]:
    if spec.is_leaf():
        return (ORDINAL_OUTPUT.format(0),), False
    children = spec.children()
    if not all(child.is_leaf() for child in children):
        raise ModelConfigError(
            f"{model_file}: forward returns nested outputs; batchserve serves programs that "
            "return a tensor, a tuple or list of tensors, or a dict of tensors"
        )
    if spec.type is dict:
        return tuple(str(key) for key in spec.context), True
    if spec.type in (tuple, list):
        return tuple(ORDINAL_OUTPUT.format(i) for i in range(len(children))), False
    raise ModelConfigError(f"{model_file}: forward returns a {spec.type.__name__}, unsupported")


def _returned_nodes(program: Any) -> list[Any]:
    """The graph values forward returns, in order (mutated buffers come first and are left)."""
    output = next(n for n in program.graph.nodes if n.op == "output")
    returned = list(output.args[0])
    return returned[len(returned) - len(program.graph_signature.user_outputs) :]


def _spec(name: str, node: Any, model_file: Path) -> TensorSpec:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    if value is None or not hasattr(value, "dtype") or not hasattr(value, "shape"):
        raise ModelConfigError(f"{model_file}: '{name}' is not a tensor; only tensors are served")
    shape = tuple(d if isinstance(d, int) else DYNAMIC for d in value.shape)
    return TensorSpec(name, datatype(value.dtype, name, model_file), shape, (None,) * len(shape))


def datatype(dtype: Any, name: str, model_file: Path) -> DataType:
    """The protocol type of a torch dtype (ModelConfigError for one without a numpy twin)."""
    wire = _WIRE_BY_TORCH.get(str(dtype).removeprefix("torch."))
    if wire is None:
        raise ModelConfigError(
            f"{model_file}: tensor '{name}' is {dtype}, which batchserve cannot send "
            f"(supported: {', '.join(_WIRE_BY_TORCH)})"
        )
    return BY_WIRE[wire]


def _batch_limit(program: Any, user_inputs: Sequence[Any]) -> int | None:
    """The upper bound of the first input's leading symbolic axis, when it has one."""
    if not user_inputs:
        return None
    shape = getattr(user_inputs[0].meta.get("val"), "shape", ())
    if not shape or isinstance(shape[0], int):
        return None
    bounds = program.range_constraints.get(shape[0].node.expr)
    upper = getattr(bounds, "upper", None)
    try:
        return int(upper) if upper is not None else None
    except (TypeError, ValueError, OverflowError, AttributeError):  # int_oo: no bound
        return None
