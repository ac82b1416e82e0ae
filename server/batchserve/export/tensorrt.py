"""Verified ONNX -> TensorRT engine, checked against PyTorch through the serving backend.

One optimisation profile covers the batch range 1..max_batch_size and every other dynamic axis
over the sizes the export was tested at. Without --fp16 TF32 is switched off, so the engine
computes in FP32 and is held to the same tolerance as ONNX Runtime.
"""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from batchserve.devices import Device, gpu_count
from batchserve.errors import DeviceUnavailable
from batchserve.export.errors import ExportError
from batchserve.export.onnx import (
    ExportReport,
    Progress,
    StagedModel,
    Target,
    merge_config,
    publish,
    stage_onnx,
)
from batchserve.export.spec import ExportSpec, Tolerance
from batchserve.export.verify import (
    TorchModel,
    VerificationReport,
    bind_module,
    check_report,
    verify,
)
from batchserve.grpc.generated.model_config_pb2 import ModelConfig
from batchserve.model_config import config_from_signature

GPU_MISSING = "--tensorrt needs an NVIDIA GPU with CUDA; none was found (NVML reports 0 devices)"
PACKAGE_MISSING = "the tensorrt package is not installed: pip install 'batchserve[gpu]'"
FP16_TOLERANCE = Tolerance(atol=1e-2, rtol=1e-2)
Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorRTOptions:
    """How the engine is built and judged.

    Args:
        fp16: allow FP16 kernels (BuilderFlag.FP16).
        workspace_mib: workspace memory pool limit; None leaves TensorRT's default.
        tolerance: None means the spec's tolerance, or atol = rtol = 1e-2 with ``fp16``.
    """

    fp16: bool = False
    workspace_mib: int | None = None
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        if self.workspace_mib is not None and self.workspace_mib < 1:
            raise ExportError(f"--workspace-mib must be >= 1, not {self.workspace_mib}")

    def tolerance_for(self, spec: ExportSpec) -> Tolerance:
        if self.tolerance is not None:
            return self.tolerance
        return FP16_TOLERANCE if self.fp16 else spec.tolerance


@dataclass(frozen=True, slots=True)
class ProfileShapes:
    """One input's min/opt/max shapes in the optimisation profile."""

    minimum: Shape
    optimum: Shape
    maximum: Shape


def require_tensorrt() -> None:
    """Fail before any work when no engine could be built or run here."""
    if gpu_count() == 0:
        raise DeviceUnavailable(GPU_MISSING)
    if importlib.util.find_spec("tensorrt") is None:
        raise DeviceUnavailable(PACKAGE_MISSING)


def tensorrt_target(spec: ExportSpec) -> Target:
    return Target(f"{spec.name}_trt", "model.plan", "tensorrt_plan", "tensorrt", gpu_only=True)


def profile_shapes(spec: ExportSpec) -> dict[str, ProfileShapes]:
    """Batch axis 1..max_batch_size (opt: largest preferred size, else the max); other axes
    cover the tested sizes, optimised for the largest."""
    low = {axis: min(spec.sizes_of(axis)) for axis in spec.dynamic_axes}
    high = {axis: max(spec.sizes_of(axis)) for axis in spec.dynamic_axes}
    opt = dict(high)
    if spec.batch_axis:
        low[spec.batch_axis] = 1
        high[spec.batch_axis] = spec.max_batch_size
        preferred = spec.serving.preferred_batch_sizes
        opt[spec.batch_axis] = max(preferred, default=spec.max_batch_size)
    return {
        item.name: ProfileShapes(item.shape(low), item.shape(opt), item.shape(high))
        for item in spec.inputs
    }


def export_tensorrt(
    module: torch.nn.Module,
    spec: ExportSpec,
    repository: Path,
    options: TensorRTOptions,
    *,
    progress: Progress | None = None,
) -> ExportReport:
    """Export and verify ONNX, build and verify an engine from it, then publish both.

    Nothing is written unless both pass. The engine lands at ``<repo>/<name>_trt/<version>/``.
    """
    require_tensorrt()
    model = bind_module(module, spec)
    with tempfile.TemporaryDirectory(prefix="batchserve-export-") as tmp:
        workdir = Path(tmp)
        onnx_model, notes = stage_onnx(model, spec, workdir, progress)
        engine = stage_engine(model, spec, onnx_model, options, progress)
        published = publish([onnx_model, engine], spec, repository)
    return ExportReport(onnx_model.signature, published, notes)


def stage_engine(
    model: TorchModel,
    spec: ExportSpec,
    onnx_model: StagedModel,
    options: TensorRTOptions,
    progress: Progress | None,
) -> StagedModel:
    """Build the engine beside the verified ONNX file and verify it against PyTorch."""
    target = tensorrt_target(spec)
    plan = onnx_model.path.with_name(target.filename)
    build_engine(onnx_model.path, spec, options, plan)
    fresh = config_from_signature(target.model_name, onnx_model.signature, spec.max_batch_size)
    config = merge_config(ModelConfig(), fresh, target, spec.serving)
    report = _verify_engine(model, spec, plan, config, options.tolerance_for(spec))
    check_report(report, progress)
    return StagedModel(plan, target, onnx_model.signature, report)


def build_engine(onnx_path: Path, spec: ExportSpec, options: TensorRTOptions, plan: Path) -> None:
    """Parse the ONNX file and serialise an engine to ``plan``."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: every network is explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise ExportError(_parser_errors(parser))
    serialized = builder.build_serialized_network(
        network, _builder_config(trt, builder, spec, options)
    )
    if serialized is None:
        raise ExportError(
            "TensorRT could not build an engine from the verified ONNX model (see its log above)"
        )
    with plan.open("wb") as file:
        file.write(serialized)


def _builder_config(trt: Any, builder: Any, spec: ExportSpec, options: TensorRTOptions) -> Any:
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, shapes in profile_shapes(spec).items():
        profile.set_shape(name, shapes.minimum, shapes.optimum, shapes.maximum)
    config.add_optimization_profile(profile)
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    if options.fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    return config


def _parser_errors(parser: Any) -> str:
    errors = [parser.get_error(i) for i in range(parser.num_errors)]
    return "TensorRT's ONNX parser rejected the model: " + "; ".join(
        _parser_error(error) for error in errors
    )


def _parser_error(error: Any) -> str:
    if error.node() < 0:
        return str(error.desc())
    return f"node {error.node()} '{error.node_name()}' ({error.node_operator()}): {error.desc()}"


def _verify_engine(
    model: TorchModel, spec: ExportSpec, plan: Path, config: ModelConfig, tolerance: Tolerance
) -> VerificationReport:
    """Run the engine the way the server will: through the TensorRT backend."""
    from batchserve.backends.tensorrt import TensorRTBackend

    backend = TensorRTBackend()
    backend.load(plan, config, Device("gpu", 0))
    try:
        return verify(model, spec, backend.infer, runtime="TensorRT", tolerance=tolerance)
    finally:
        backend.unload()
