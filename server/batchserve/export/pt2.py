"""PyTorch -> ``torch.export`` program (``model.pt2``), verified through the serving backend.

The module is wrapped so the program returns a dict keyed by the output names, and so its
inputs keep ``forward``'s parameter names: the server reads both back from the program. The
batch axis is a ``torch.export.Dim`` up to ``--max-batch-size``; every other named axis is
a ``Dim`` of its own. The saved archive is then loaded the way the server loads it (checked,
on the CPU) and compared with the eager module on the same cases as the ONNX path.
"""

from __future__ import annotations

import inspect
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from batchserve.core.progress import StageProgress
from batchserve.export.comparison import check_report
from batchserve.export.errors import ExportError, first_line
from batchserve.export.inputs import Array, Arrays, trace_inputs
from batchserve.export.onnx import (
    ExportReport,
    Progress,
    StagedModel,
    Target,
    bind_stage,
    publish_stage,
    silent_stages,
    verify_detail,
)
from batchserve.export.spec import ExportSpec
from batchserve.export.torch_model import TorchModel
from batchserve.export.verify import Runner, verify
from batchserve.proto.model_config_pb2 import ModelConfig

RUNTIME = "torch.export (batchserve's loader, CPU)"


def pt2_target(spec: ExportSpec) -> Target:
    return Target(spec.name, "model.pt2", "torch_export", "pytorch")


def export_pt2(
    module: torch.nn.Module,
    spec: ExportSpec,
    repository: Path,
    *,
    progress: Progress | None = None,
    stages: StageProgress | None = None,
) -> ExportReport:
    """Export and verify ``module``; publish into ``repository`` only if every case passes.

    Raises ExportError when torch.export cannot capture the module (the message says why)
    and VerificationFailed when the loaded program disagrees with the eager module.
    """
    stages = stages or silent_stages()
    model = bind_stage(module, spec, stages)
    with tempfile.TemporaryDirectory(prefix="batchserve-export-") as tmp:
        staged, notes = stage_pt2(model, spec, Path(tmp), progress, stages)
        published = publish_stage([staged], spec, repository, stages)
    return ExportReport(staged.signature, published, notes)


def stage_pt2(
    model: TorchModel,
    spec: ExportSpec,
    workdir: Path,
    progress: Progress | None,
    stages: StageProgress | None = None,
) -> tuple[StagedModel, tuple[str, ...]]:
    """Export into ``workdir`` and verify; returns the staged model and exporter warnings."""
    stages = stages or silent_stages()
    target = pt2_target(spec)
    path = workdir / target.filename
    with stages.stage("export", f"{type(model.module).__name__} with torch.export"):
        program, notes = _export(model, spec)
        torch.export.save(program, str(path))
        backend = _serving_backend(path, spec)
    try:
        signature = backend.signature
        declared = {tensor.name: tensor.shape for tensor in signature.outputs}
        with stages.stage("verify", verify_detail(RUNTIME, model, spec)):
            report = verify(
                model,
                spec,
                _runner(backend),
                runtime=RUNTIME,
                tolerance=spec.tolerance,
                declared=declared,
            )
            check_report(report, progress)
    finally:
        backend.unload()
    return StagedModel(path, target, signature, report), notes


def named_outputs(model: TorchModel) -> torch.nn.Module:
    """The module as torch.export should see it: forward's parameters by name, outputs in a
    dict keyed by ``model.outputs`` (a program keeps both, so the server can name them)."""
    wrapper = _NamedOutputs(model)
    parameters = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in model.inputs
    ]

    def forward(*args: torch.Tensor) -> dict[str, torch.Tensor]:
        return wrapper.named(*args)

    forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    wrapper.forward = forward
    return wrapper


class _NamedOutputs(torch.nn.Module):
    def __init__(self, model: TorchModel) -> None:
        super().__init__()
        self.inner = model.module
        self.outputs = model.outputs

    def named(self, *args: torch.Tensor) -> dict[str, torch.Tensor]:
        result = self.inner(*args)
        values = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        return dict(zip(self.outputs, values, strict=True))


def dynamic_shapes(spec: ExportSpec, model: TorchModel) -> tuple[dict[int, Any], ...]:
    """One ``Dim`` per named axis, shared by every input that names it, in forward's order.

    The batch axis runs 1..max_batch_size (a batch of one sample is static: no Dim); the
    others are unbounded above.
    """
    dims: dict[str, Any] = {}
    for axis in (spec.batch_axis, *spec.dynamic_axes):
        if axis is None or (axis == spec.batch_axis and spec.max_batch_size < 2):
            continue
        high = spec.max_batch_size if axis == spec.batch_axis else None
        dims[axis] = torch.export.Dim(axis, min=1, max=high)
    shapes = []
    for name in model.inputs:
        item = spec.input(name)
        assert item is not None  # bind_module bound every declared input
        shapes.append(
            {i: dims[d] for i, d in enumerate(item.dims) if isinstance(d, str) and d in dims}
        )
    return tuple(shapes)


def _export(model: TorchModel, spec: ExportSpec) -> tuple[Any, tuple[str, ...]]:
    args = model.arguments(trace_inputs(spec))
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            program = torch.export.export(
                named_outputs(model), args, dynamic_shapes=dynamic_shapes(spec, model)
            )
        except Exception as exc:
            raise ExportError(_export_failure(model, exc)) from None
    notes = (f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught)
    return program, tuple(dict.fromkeys(notes))


def _export_failure(model: TorchModel, exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    detail = " ".join(lines[:3]) if lines else type(exc).__name__
    return (
        f"cannot export {type(model.module).__name__} with torch.export: "
        f"{type(exc).__name__}: {detail or first_line(exc)}"
    )


def _serving_backend(path: Path, spec: ExportSpec) -> Any:
    """The program loaded as the server loads it: the checked archive reader, on the CPU."""
    from batchserve.backends.torch_pt2 import TorchBackend
    from batchserve.core.device import CPU

    backend = TorchBackend()
    backend.load(path, ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size), CPU)
    return backend


def _runner(backend: Any) -> Runner:
    def run(inputs: Mapping[str, Array]) -> Arrays:
        return dict(backend.infer(inputs))

    return run
