"""Verified ONNX -> TensorRT engine, checked through the serving backend.

One optimisation profile per preferred batch size (``--preferred-batch-size``, or
``--profile-batch-sizes``), each tuned (``opt``) for that size and taking the batches above
the previous one; a last profile reaches max_batch_size. Other dynamic axes cover the sizes
the export was tested at. The server runs each batch on the profile tuned nearest its size.

Without --fp16 TF32 is switched off, so the engine computes in FP32 and is held to the same
tolerance against PyTorch as ONNX Runtime. --fp16 builds a strongly typed network from an
FP16-typed copy of the ONNX graph (FP32 inputs and outputs, casts at the edges): TensorRT 11
removed the precision flags (BuilderFlag.FP16) and is always strongly typed, and TensorRT 10
deprecated them, so one way serves both majors. The FP16 engine is compared with the FP32
ONNX model on ONNX Runtime's CPU provider, on the same inputs, with a tolerance scaled to
each output's range (FP16 keeps 11 significant bits, so an element-wise bound fails on
values near zero while saying nothing about the ones that matter).
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from batchserve.backends.gpu_plan import plan_profiles
from batchserve.core.device import Device
from batchserve.core.errors import DeviceUnavailable
from batchserve.core.progress import StageProgress
from batchserve.devices.placement import gpu_count
from batchserve.export.comparison import ScaledTolerance, VerificationReport, check_report
from batchserve.export.errors import ExportError
from batchserve.export.onnx import (
    ExportReport,
    Progress,
    StagedModel,
    Target,
    bind_stage,
    merge_config,
    onnxruntime_runner,
    publish_stage,
    silent_stages,
    stage_onnx,
    verify_detail,
)
from batchserve.export.spec import ExportSpec, Tolerance
from batchserve.export.torch_model import TorchModel
from batchserve.export.verify import Runner, verify, verify_against
from batchserve.models.model_config import config_from_signature
from batchserve.proto.model_config_pb2 import ModelConfig

GPU_MISSING = "--tensorrt needs an NVIDIA GPU with CUDA; none was found (NVML reports 0 devices)"
PACKAGE_MISSING = "the tensorrt package is not installed: pip install 'batchserve[gpu]'"
FP16_TOLERANCE = ScaledTolerance(fraction=1e-2, rtol=1e-2)
FP16_REFERENCE = "ONNX Runtime FP32 (CPU)"
Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorRTOptions:
    """How the engine is built and judged.

    Args:
        fp16: compute in FP16 (an FP16-typed, strongly typed network; FP32 inputs and outputs).
        workspace_mib: workspace memory pool limit; None leaves TensorRT's default.
        tolerance: without ``fp16``, the element-wise tolerance against PyTorch (None: the
            spec's); with it, ``atol`` is a fraction of each output's range and ``rtol`` is
            relative to each element, against the FP32 ONNX model (None: 1e-2 and 1e-2).
        profile_batch_sizes: the batch sizes optimisation profiles are tuned for; empty means
            the preferred batch sizes.
    """

    fp16: bool = False
    workspace_mib: int | None = None
    tolerance: Tolerance | None = None
    profile_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.workspace_mib is not None and self.workspace_mib < 1:
            raise ExportError(f"--workspace-mib must be >= 1, not {self.workspace_mib}")

    def tolerance_for(self, spec: ExportSpec) -> Tolerance:
        return spec.tolerance if self.tolerance is None else self.tolerance

    def fp16_tolerance(self) -> ScaledTolerance:
        if self.tolerance is None:
            return FP16_TOLERANCE
        return ScaledTolerance(fraction=self.tolerance.atol, rtol=self.tolerance.rtol)


@dataclass(frozen=True, slots=True)
class ProfileShapes:
    """One input's min/opt/max shapes in an optimisation profile."""

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


def profile_shapes(
    spec: ExportSpec, batch_sizes: tuple[int, ...] = ()
) -> tuple[dict[str, ProfileShapes], ...]:
    """Each optimisation profile's shapes, per input (``plan_profiles`` splits the batch axis).

    ``batch_sizes`` are the sizes profiles are tuned for; empty means the preferred batch
    sizes, and without those one profile 1..max_batch_size tuned for the max. Other axes
    cover the tested sizes, tuned for the largest. No batch axis: one profile.
    """
    low = {axis: min(spec.sizes_of(axis)) for axis in spec.dynamic_axes}
    high = {axis: max(spec.sizes_of(axis)) for axis in spec.dynamic_axes}
    batch_axis = spec.batch_axis
    if batch_axis is None:
        if batch_sizes:
            raise ExportError("--profile-batch-sizes needs a batch axis (--max-batch-size > 0)")
        return (_profile(spec, low, high, high),)
    tuned = batch_sizes or spec.serving.preferred_batch_sizes
    try:
        ranges = plan_profiles(tuned, spec.max_batch_size)
    except ValueError as exc:
        raise ExportError(f"optimisation profile batch sizes: {exc}") from None
    tested = spec.sizes_of(batch_axis)
    for batch in ranges:
        if not any(batch.covers(size) for size in tested):
            raise ExportError(
                f"the optimisation profile for batches {batch.low}..{batch.high} would go "
                f"unverified: no --batch-sizes value ({','.join(map(str, tested))}) falls in "
                f"it; add one, e.g. --batch-sizes {','.join(map(str, (*tested, batch.opt)))}"
            )
    return tuple(
        _profile(
            spec,
            low | {batch_axis: batch.low},
            high | {batch_axis: batch.opt},
            high | {batch_axis: batch.high},
        )
        for batch in ranges
    )


def _profile(
    spec: ExportSpec, low: dict[str, int], opt: dict[str, int], high: dict[str, int]
) -> dict[str, ProfileShapes]:
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
    stages: StageProgress | None = None,
) -> ExportReport:
    """Export and verify ONNX, build and verify an engine from it, then publish both.

    Nothing is written unless both pass. The engine lands at ``<repo>/<name>_trt/<version>/``.
    """
    require_tensorrt()
    stages = stages or silent_stages()
    model = bind_stage(module, spec, stages)
    with tempfile.TemporaryDirectory(prefix="batchserve-export-") as tmp:
        workdir = Path(tmp)
        onnx_model, notes = stage_onnx(model, spec, workdir, progress, stages)
        engine = stage_engine(model, spec, onnx_model, options, progress, stages)
        published = publish_stage([onnx_model, engine], spec, repository, stages)
    return ExportReport(onnx_model.signature, published, notes)


def stage_engine(
    model: TorchModel,
    spec: ExportSpec,
    onnx_model: StagedModel,
    options: TensorRTOptions,
    progress: Progress | None,
    stages: StageProgress | None = None,
) -> StagedModel:
    """Build the engine beside the verified ONNX file and verify it as the server runs it.

    FP32: against PyTorch. FP16: against the FP32 ONNX model on ONNX Runtime's CPU provider.
    """
    stages = stages or silent_stages()
    target = tensorrt_target(spec)
    plan = onnx_model.path.with_name(target.filename)
    precision = "FP16" if options.fp16 else "FP32"
    with stages.stage("build engine", f"TensorRT {precision} from the verified ONNX model"):
        build_engine(onnx_model.path, spec, options, plan)
    fresh = config_from_signature(target.model_name, onnx_model.signature, spec.max_batch_size)
    config = merge_config(ModelConfig(), fresh, target, spec.serving)
    if options.fp16:
        detail = f"TensorRT vs {FP16_REFERENCE}, {len(spec.cases())} cases"
    else:
        detail = verify_detail("TensorRT", model, spec)
    with stages.stage("verify engine", detail):
        if options.fp16:
            reference = onnxruntime_runner(onnx_model.path)
            report = _verify_fp16(reference, spec, plan, config, options.fp16_tolerance())
        else:
            report = _verify_engine(model, spec, plan, config, options.tolerance_for(spec))
        check_report(report, progress)
    return StagedModel(plan, target, onnx_model.signature, report)


def build_engine(onnx_path: Path, spec: ExportSpec, options: TensorRTOptions, plan: Path) -> None:
    """Parse the ONNX file and serialise an engine to ``plan``."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, fp16=options.fp16))
    parser = trt.OnnxParser(network, logger)
    source = fp16_graph(onnx_path) if options.fp16 else onnx_path
    if not parser.parse_from_file(str(source)):
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


def network_flags(trt: Any, *, fp16: bool) -> int:
    """Explicit batch always (TensorRT 10+); strongly typed for FP16.

    A strongly typed network computes each layer in the type the graph gives it, so an
    FP16-typed graph runs in FP16. TensorRT 11 is strongly typed whatever the flags and
    deprecates the flag, so it is set on TensorRT 10 alone.
    """
    if not fp16 or tensorrt_major(trt) >= 11:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def tensorrt_major(trt: Any) -> int:
    return int(str(trt.__version__).split(".", 1)[0])


def fp16_graph(onnx_path: Path) -> Path:
    """An FP16-typed copy of the ONNX file beside it, with FP32 inputs and outputs kept.

    onnxconverter-common's converter casts weights and activations and leaves the ops that
    have no FP16 kernel, or overflow in it, in FP32 behind casts.
    """
    import onnx
    from onnxconverter_common import float16

    model = onnx.load(str(onnx_path))
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    target = onnx_path.with_name(f"{onnx_path.stem}.fp16.onnx")
    onnx.save(converted, str(target))
    return target


def _builder_config(trt: Any, builder: Any, spec: ExportSpec, options: TensorRTOptions) -> Any:
    config = builder.create_builder_config()
    for shapes_by_input in profile_shapes(spec, options.profile_batch_sizes):
        profile = builder.create_optimization_profile()
        for name, shapes in shapes_by_input.items():
            profile.set_shape(name, shapes.minimum, shapes.optimum, shapes.maximum)
        config.add_optimization_profile(profile)
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    # TF32 is on by default and would round FP32 layers (FP16 engines keep a few, behind
    # their casts) to a 10-bit mantissa.
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


@contextlib.contextmanager
def _served_engine(plan: Path, config: ModelConfig) -> Iterator[Runner]:
    """The engine loaded the way the server will load it: through the TensorRT backend."""
    from batchserve.backends.tensorrt import TensorRTBackend

    backend = TensorRTBackend()
    backend.load(plan, config, Device("gpu", 0))
    try:
        yield backend.infer
    finally:
        backend.unload()


def _verify_engine(
    model: TorchModel, spec: ExportSpec, plan: Path, config: ModelConfig, tolerance: Tolerance
) -> VerificationReport:
    """The engine against the PyTorch model."""
    with _served_engine(plan, config) as engine:
        return verify(model, spec, engine, runtime="TensorRT", tolerance=tolerance)


def _verify_fp16(
    reference: Runner, spec: ExportSpec, plan: Path, config: ModelConfig, tolerance: ScaledTolerance
) -> VerificationReport:
    """The FP16 engine against the FP32 ONNX model."""
    with _served_engine(plan, config) as engine:
        return verify_against(
            reference,
            engine,
            spec,
            runtime="TensorRT FP16",
            reference_name=FP16_REFERENCE,
            tolerance=tolerance,
        )
