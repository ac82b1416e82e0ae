"""The PyTorch side of a comparison: the module in eval mode, called with its bound inputs.

``bind_module`` checks once, on the trace inputs, what export would otherwise fail on late:
inputs forward does not take, outputs that are not tensors, the server cannot send, or do
not lead with the batch axis.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from batchserve.export.errors import ExportError
from batchserve.export.image_input import ImageInput
from batchserve.export.image_module import BytesImageModule
from batchserve.export.inputs import Array, Arrays, describe, trace_inputs
from batchserve.export.spec import ExportSpec

_OUTPUT_TYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
)


@dataclass(frozen=True, slots=True)
class TorchModel:
    """A module in eval mode with its inputs bound to forward's parameters (``_forward_order``).

    Args:
        module: the module.
        inputs: input names in forward's parameter order (passed positionally).
        outputs: names given to forward's outputs, in order.
        reference: what ``run`` answers instead of ``module``: a module behind the conversion
            of an image sent as bytes is checked against the module alone, on inputs
            converted outside the graph.
        framework: what reports call this side of a comparison (``framework_of``).
    """

    module: torch.nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: Callable[[Mapping[str, Array]], Arrays] | None = None
    framework: str = "PyTorch"

    def arguments(self, arrays: Mapping[str, Array]) -> tuple[torch.Tensor, ...]:
        """Copies, so a forward that writes into its inputs cannot change the other side's data."""
        return tuple(torch.from_numpy(arrays[name].copy()) for name in self.inputs)

    def forward(self, arrays: Mapping[str, Array]) -> tuple[torch.Tensor, ...]:
        try:
            with torch.no_grad():
                result = self.module(*self.arguments(arrays))
        except Exception as exc:
            raise ExportError(
                f"{type(self.module).__name__}.forward failed on the declared inputs "
                f"{describe(arrays)}: {type(exc).__name__}: {exc}"
            ) from None
        return _flatten(self.module, result)

    def run(self, arrays: Mapping[str, Array]) -> Arrays:
        """The outputs the converted model must reproduce for these inputs."""
        if self.reference is not None:
            return self.reference(arrays)
        results = self.forward(arrays)
        pairs = zip(self.outputs, results, strict=True)
        return {name: tensor.detach().cpu().numpy() for name, tensor in pairs}


def bind_module(module: torch.nn.Module, spec: ExportSpec) -> TorchModel:
    """Put the module in eval mode, bind its inputs, and name its outputs from a trial pass.

    With an image input sent as bytes, the module is bound to the float NCHW input it takes
    and put behind the conversion.
    """
    module.eval()
    if spec.image_input is not None:
        return _bind_behind_conversion(module, spec, spec.image_input)
    probe = TorchModel(module, _forward_order(module, spec), ())
    results = probe.forward(trace_inputs(spec))
    names = _output_names(spec, len(results))
    _check_outputs(spec, names, results)
    return TorchModel(module, probe.inputs, names, framework=framework_of(module))


def framework_of(module: torch.nn.Module) -> str:
    """Who computed the expected numbers: PyTorch, or the framework an adapter runs (Keras).

    An adapter says so with a ``framework`` class attribute, so a report reads "ONNX Runtime
    vs Keras" when the reference really is the Keras model.
    """
    name = getattr(type(module), "framework", None)
    return name if isinstance(name, str) else "PyTorch"


def _bind_behind_conversion(
    module: torch.nn.Module, spec: ExportSpec, image: ImageInput
) -> TorchModel:
    plain = bind_module(module, image.float_spec(spec))
    item = spec.input(image.input)
    assert item is not None  # ExportSpec checked it
    # eval mode too: exporters put a module back in the mode it had, its children included
    wrapped = BytesImageModule(plain.module, plain.inputs, image, len(item.dims)).eval()

    def reference(arrays: Mapping[str, Array]) -> Arrays:
        return plain.run(image.convert(arrays))

    return TorchModel(wrapped, plain.inputs, plain.outputs, reference, plain.framework)


def _forward_order(module: torch.nn.Module, spec: ExportSpec) -> tuple[str, ...]:
    """Declared inputs in the order forward takes them, so ONNX input names match the right tensors.

    By name when every declared name is one of forward's parameters (then they may be declared
    in any order); otherwise by position, as ``torch.onnx.export`` binds ``input_names``, so an
    ``nn.Sequential`` (``forward(input)``) can serve an input called ``image``.
    """
    declared = [item.name for item in spec.inputs]
    params = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
        return tuple(declared)
    positional = [
        name
        for name, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    call = f"{type(module).__name__}.forward({', '.join(positional)})"
    if not all(name in positional for name in declared):
        required = [name for name in positional if params[name].default is inspect.Parameter.empty]
        return _by_position(declared, positional, len(required), call)
    order = positional[: len(declared)]
    missing = [name for name in order if name not in declared]
    if missing:
        raise ExportError(f"{call} takes '{missing[0]}' before the declared inputs; declare it too")
    return tuple(order)


def _by_position(
    declared: Sequence[str], positional: Sequence[str], required: int, call: str
) -> tuple[str, ...]:
    """The i-th declared input is forward's i-th parameter; only the count can be wrong."""
    if not required <= len(declared) <= len(positional):
        takes = f"{required} to {len(positional)}" if required < len(positional) else required
        raise ExportError(
            f"{len(declared)} input(s) declared ({', '.join(declared)}) but {call} takes "
            f"{takes}; inputs whose names are not all forward's parameters are bound by position"
        )
    for index, name in enumerate(declared):
        if name in positional and positional.index(name) != index:
            raise ExportError(
                f"input '{name}' is declared at position {index + 1} but is parameter "
                f"{positional.index(name) + 1} of {call}: declare the inputs in forward's order"
            )
    return tuple(declared)


def _flatten(module: torch.nn.Module, result: object) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    if (
        isinstance(result, tuple | list)
        and result
        and all(isinstance(t, torch.Tensor) for t in result)
    ):
        return tuple(result)
    raise ExportError(
        f"{type(module).__name__}.forward returned {type(result).__name__}; "
        "export needs a tensor or a tuple/list of tensors"
    )


def _output_names(spec: ExportSpec, count: int) -> tuple[str, ...]:
    if not spec.outputs:
        return tuple(f"output{i}" for i in range(count))
    if len(spec.outputs) != count:
        raise ExportError(
            f"forward returns {count} output(s) but {len(spec.outputs)} --output name(s) were "
            f"given ({', '.join(spec.outputs)})"
        )
    return spec.outputs


def _check_outputs(spec: ExportSpec, names: Sequence[str], results: Sequence[torch.Tensor]) -> None:
    batch = spec.trace_case()[spec.batch_axis] if spec.batch_axis else None
    for name, tensor in zip(names, results, strict=True):
        if tensor.dtype not in _OUTPUT_TYPES:
            raise ExportError(f"output '{name}' is {tensor.dtype}, which the server cannot send")
        if batch is not None and (tensor.dim() == 0 or tensor.shape[0] != batch):
            raise ExportError(
                f"output '{name}' has shape {list(tensor.shape)} for a batch of {batch}: with "
                "--max-batch-size > 0 every output's first axis must be the batch axis"
            )
