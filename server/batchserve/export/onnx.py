"""PyTorch -> ONNX (TorchScript exporter), the ONNX checker, and publishing into a repository.

Everything is built and verified in a temporary directory; the repository only changes once
every check has passed, and then one file at a time by atomic rename.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import onnx
import torch
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.core.progress import StageProgress
from batchserve.core.signature import ModelSignature
from batchserve.export.comparison import VerificationReport, check_report
from batchserve.export.errors import ExportError, first_line
from batchserve.export.inputs import Array, Arrays, trace_inputs
from batchserve.export.spec import ExportSpec, ServingOptions
from batchserve.export.torch_model import TorchModel, bind_module
from batchserve.export.verify import Runner, verify
from batchserve.models.model_config import (
    CONFIG_FILENAME,
    config_from_signature,
    load_pbtxt,
    to_pbtxt,
)
from batchserve.proto.model_config_pb2 import (
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
)

Progress = Callable[[VerificationReport], None]
_Tensor = TypeVar("_Tensor", ModelInput, ModelOutput)
# Warnings the TorchScript exporter always gives; we chose it on purpose (no onnxscript).
_EXPECTED_WARNINGS = (
    "You are using the legacy TorchScript-based ONNX export",
    "The feature will be removed",
)
_OPERATOR = re.compile(r"operator '([^']+)'")


@dataclass(frozen=True, slots=True)
class Target:
    """Where and as what a model file is served.

    Args:
        model_name: directory (and config name) in the repository.
        filename: file name inside the version directory.
        platform: config.pbtxt ``platform``.
        backend: config.pbtxt ``backend``.
        gpu_only: the file only runs on a GPU (adds a KIND_GPU instance group if none is set).
    """

    model_name: str
    filename: str
    platform: str
    backend: str
    gpu_only: bool = False


@dataclass(frozen=True, slots=True)
class StagedModel:
    """A converted, checked and verified model file, still outside the repository."""

    path: Path
    target: Target
    signature: ModelSignature
    verification: VerificationReport


@dataclass(frozen=True, slots=True)
class PublishedModel:
    """A model file and its config in the repository, with the check that let it in."""

    name: str
    model_file: Path
    config_file: Path
    verification: VerificationReport


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What an export produced: the signature, each published model, and exporter warnings."""

    signature: ModelSignature
    models: tuple[PublishedModel, ...]
    warnings: tuple[str, ...]


def onnx_target(spec: ExportSpec) -> Target:
    return Target(spec.name, "model.onnx", "onnxruntime_onnx", "onnxruntime")


def export_onnx(
    module: torch.nn.Module,
    spec: ExportSpec,
    repository: Path,
    *,
    progress: Progress | None = None,
    stages: StageProgress | None = None,
) -> ExportReport:
    """Export, check and verify ``module``; publish into ``repository`` only if all pass.

    Raises ExportError when the module cannot be exported (the message names the operator or
    input at fault) and VerificationFailed when ONNX Runtime disagrees with PyTorch.
    ``stages`` is told when each stage (export, verify, publish) starts and ends.
    """
    stages = stages or silent_stages()
    model = bind_stage(module, spec, stages)
    with tempfile.TemporaryDirectory(prefix="batchserve-export-") as tmp:
        staged, notes = stage_onnx(model, spec, Path(tmp), progress, stages)
        published = publish_stage([staged], spec, repository, stages)
    return ExportReport(staged.signature, published, notes)


def stage_onnx(
    model: TorchModel,
    spec: ExportSpec,
    workdir: Path,
    progress: Progress | None,
    stages: StageProgress | None = None,
) -> tuple[StagedModel, tuple[str, ...]]:
    """Export into ``workdir``, run the checker and verify; returns the model and warnings."""
    stages = stages or silent_stages()
    target = onnx_target(spec)
    path = workdir / target.filename
    with stages.stage("export", f"{type(model.module).__name__} to ONNX (opset {spec.opset})"):
        notes = _export(model, spec, path)
        _run_checker(path)
        signature = read_onnx_signature(path)
        _check_graph_inputs(model, signature)
    declared = {tensor.name: tensor.shape for tensor in signature.outputs}
    with stages.stage("verify", verify_detail("ONNX Runtime", model, spec)):
        report = verify(
            model,
            spec,
            onnxruntime_runner(path),
            runtime="ONNX Runtime",
            tolerance=spec.tolerance,
            declared=declared,
        )
        check_report(report, progress)
    return StagedModel(path, target, signature, report), notes


def bind_stage(module: torch.nn.Module, spec: ExportSpec, stages: StageProgress) -> TorchModel:
    """``bind_module`` as the first stage of an export: one forward pass on the trace inputs."""
    with stages.stage("check", f"{type(module).__name__}.forward on the declared inputs"):
        return bind_module(module, spec)


def silent_stages() -> StageProgress:
    """Stage timings for a caller that shows none (the Python API, the zoo)."""
    return StageProgress("batchserve export")


def verify_detail(runtime: str, model: TorchModel, spec: ExportSpec) -> str:
    """``ONNX Runtime vs Keras, 3 cases``: what a verify stage compares."""
    return f"{runtime} vs {model.framework}, {len(spec.cases())} cases"


def onnxruntime_runner(path: Path) -> Runner:
    """Run an ONNX file on ONNX Runtime's CPU provider, as the ``cpu`` server install does."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures are reported per case, not logged twice
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExportError(f"ONNX Runtime cannot load the exported model: {exc}") from None
    names = [output.name for output in session.get_outputs()]

    def run(inputs: Mapping[str, Array]) -> Arrays:
        return dict(zip(names, session.run(names, dict(inputs)), strict=True))

    return run


def publish_stage(
    staged: Sequence[StagedModel], spec: ExportSpec, repository: Path, stages: StageProgress
) -> tuple[PublishedModel, ...]:
    """``publish`` as the last stage of an export."""
    names = ", ".join(dict.fromkeys(item.target.model_name for item in staged))
    with stages.stage("publish", f"{names} into {repository}"):
        return publish(staged, spec, repository)


def publish(
    staged: Sequence[StagedModel], spec: ExportSpec, repository: Path
) -> tuple[PublishedModel, ...]:
    """Move verified files into the repository and write their configs.

    Every config is built (and any existing one read) before the first file moves, so a
    broken existing config.pbtxt stops the export with the repository untouched.
    """
    configs = [build_config(item, spec, repository) for item in staged]
    return tuple(
        _publish_one(item, config, spec, repository)
        for item, config in zip(staged, configs, strict=True)
    )


def build_config(staged: StagedModel, spec: ExportSpec, repository: Path) -> ModelConfig:
    """The new config, merged into the existing config.pbtxt if there is one."""
    path = repository / staged.target.model_name / CONFIG_FILENAME
    existing = load_pbtxt(path) if path.exists() else ModelConfig()
    name = staged.target.model_name
    fresh = config_from_signature(name, staged.signature, spec.max_batch_size)
    return merge_config(existing, fresh, staged.target, spec.serving)


def merge_config(
    existing: ModelConfig, fresh: ModelConfig, target: Target, serving: ServingOptions
) -> ModelConfig:
    """Keep every field the user set; take name, tensors and batch size from the model file.

    Per-tensor fields the model file does not decide (format, reshape, label_filename, ...)
    are kept for tensors whose name is unchanged.
    """
    config = ModelConfig()
    config.CopyFrom(existing)
    config.name = fresh.name
    config.max_batch_size = fresh.max_batch_size
    config.platform = target.platform
    config.backend = target.backend
    _replace_tensors(config.input, fresh.input)
    _replace_tensors(config.output, fresh.output)
    _apply_serving(config, serving)
    if target.gpu_only and not config.instance_group:
        config.instance_group.add(kind=ModelInstanceGroup.KIND_GPU, count=1)
    return config


def _replace_tensors(
    current: RepeatedCompositeFieldContainer[_Tensor],
    fresh: RepeatedCompositeFieldContainer[_Tensor],
) -> None:
    previous = {tensor.name: tensor for tensor in current}
    merged = []
    for tensor in fresh:
        entry = type(tensor)()
        if tensor.name in previous:
            entry.CopyFrom(previous[tensor.name])
        entry.name = tensor.name
        entry.data_type = tensor.data_type
        entry.dims[:] = tensor.dims
        merged.append(entry)
    del current[:]
    current.extend(merged)


def _apply_serving(config: ModelConfig, serving: ServingOptions) -> None:
    if serving.dynamic_batching:
        batching = config.dynamic_batching
        batching.SetInParent()
        if serving.max_queue_delay_us is not None:
            batching.max_queue_delay_microseconds = serving.max_queue_delay_us
        if serving.preferred_batch_sizes:
            batching.preferred_batch_size[:] = serving.preferred_batch_sizes
    if serving.sequence_length_input is not None:
        config.batchserve.sequence_length_input = serving.sequence_length_input


def _publish_one(
    staged: StagedModel, config: ModelConfig, spec: ExportSpec, repository: Path
) -> PublishedModel:
    model_dir = repository / staged.target.model_name
    version_dir = model_dir / str(spec.version)
    version_dir.mkdir(parents=True, exist_ok=True)
    model_file = version_dir / staged.target.filename
    _replace_file(model_file, lambda partial: shutil.copyfile(staged.path, partial))
    config_file = model_dir / CONFIG_FILENAME
    _replace_file(config_file, lambda partial: partial.write_text(to_pbtxt(config), "utf-8"))
    return PublishedModel(config.name, model_file, config_file, staged.verification)


def _replace_file(path: Path, write: Callable[[Path], object]) -> None:
    """Write beside the destination, then rename: a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _export(model: TorchModel, spec: ExportSpec, path: Path) -> tuple[str, ...]:
    args = model.arguments(trace_inputs(spec))
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            torch.onnx.export(
                model.module,
                args,
                str(path),
                input_names=list(model.inputs),
                output_names=list(model.outputs),
                dynamic_axes=_dynamic_axes(spec, model),
                opset_version=spec.opset,
                do_constant_folding=True,
                dynamo=False,
            )
        except Exception as exc:
            raise ExportError(_export_failure(model, spec, exc)) from None
    return _notes(model.module, caught)


def _dynamic_axes(spec: ExportSpec, model: TorchModel) -> dict[str, dict[int, str]]:
    """Named input axes; outputs get only the batch axis, the exporter infers the rest."""
    axes = {
        item.name: {i: dim for i, dim in enumerate(item.dims) if isinstance(dim, str)}
        for item in spec.inputs
    }
    if spec.batch_axis:
        axes.update({name: {0: spec.batch_axis} for name in model.outputs})
    return {name: named for name, named in axes.items() if named}


def _export_failure(model: TorchModel, spec: ExportSpec, exc: Exception) -> str:
    module = type(model.module).__name__
    message = str(exc).strip()
    operator = _OPERATOR.search(message)
    if isinstance(exc, torch.onnx.errors.UnsupportedOperatorError) and operator:
        return (
            f"cannot export {module} to ONNX: operator '{operator.group(1)}' is not supported "
            f"at opset {spec.opset} ({message})"
        )
    return f"cannot export {module} to ONNX: {type(exc).__name__}: {first_line(exc)}"


def _notes(module: torch.nn.Module, caught: Sequence[warnings.WarningMessage]) -> tuple[str, ...]:
    """The exporter's warnings, less those expected of every export of this kind of module.

    An adapter lists its own in ``expected_warnings``: Keras reads static shapes as Python
    numbers while it is traced, which the verification at several sizes checks anyway.
    """
    expected = _EXPECTED_WARNINGS + tuple(getattr(type(module), "expected_warnings", ()))
    notes = (
        f"{w.category.__name__}: {' '.join(str(w.message).split())}"
        for w in caught
        if not str(w.message).startswith(expected)
    )
    return tuple(dict.fromkeys(notes))


def _run_checker(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ExportError(f"the exported graph fails the ONNX checker: {exc}") from None


def _check_graph_inputs(model: TorchModel, signature: ModelSignature) -> None:
    """The exporter drops inputs forward never reads; the served signature would then lie."""
    graph_inputs = {tensor.name for tensor in signature.inputs}
    for name in model.inputs:
        if name not in graph_inputs:
            raise ExportError(
                f"input '{name}' does not affect {type(model.module).__name__}'s outputs, so "
                "the exported graph has no such input; remove its --input or use it in forward"
            )
