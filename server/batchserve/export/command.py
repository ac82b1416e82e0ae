"""``batchserve export``: load a module from a factory or a Keras 3 file, export, verify and
publish it.

Exit codes: 0 exported, 1 the converted model disagrees with PyTorch (or Keras), 2 it could
not be exported (bad arguments, unsupported operator, signature that does not fit the module).
torch, keras and the exporters are imported inside the handler, so other subcommands stay fast.
Results go to stdout; progress (stage by stage) goes to stderr, and only to a terminal.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchserve.core.errors import BatchserveError, InvalidArgument
from batchserve.core.progress import StageProgress
from batchserve.export.errors import ExportError, VerificationFailed, first_line
from batchserve.export.image_input import LAYOUTS, ImageInput, parse_normalize
from batchserve.export.spec import (
    ExportSpec,
    InputSpec,
    ServingOptions,
    Tolerance,
    parse_axis_sizes,
    parse_input_spec,
    parse_sizes,
)

if TYPE_CHECKING:
    import torch

    from batchserve.export.comparison import VerificationReport
    from batchserve.export.onnx import ExportReport
    from batchserve.export.tensorrt import TensorRTOptions

PROG = "batchserve export"
KERAS_SUFFIX = ".keras"
"""A MODEL ending so is a Keras 3 file (Keras saves and loads that format under no other
name); anything else is a factory, which always has a ':'."""
DESCRIPTION = """\
Export a PyTorch module, or a Keras 3 model file (model.keras, run with Keras' torch backend),
to ONNX (and, with --tensorrt, to a TensorRT engine) or, with --format pt2, to a torch.export
program; compare it with the original model on random inputs at every tested batch and axis
size, and only then write it into the model repository with its config.pbtxt.

--input specs bind to forward's parameters by name when every name is one, otherwise by
position. A Keras model's inputs (names, dtypes, shapes; None dims become named axes) are used
when no --input is given.

Progress goes to stderr when it is a terminal (not with --quiet); results go to stdout.

exit codes: 0 exported; 1 the converted model disagrees with the original (nothing written);
2 it could not be exported (the message names the argument, operator or input at fault)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a PyTorch module or a Keras 3 model to ONNX (and TensorRT) or "
        "torch.export, verified",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_arguments(parser)
    _add_image_arguments(parser)
    _add_test_arguments(parser)
    _add_serving_arguments(parser)
    _add_tensorrt_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """The handler: print results and a summary; errors become one line on stderr."""
    stages = StageProgress.for_stderr(PROG, quiet=args.quiet)
    try:
        report = _export(args, stages)
    except VerificationFailed as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return 1
    except BatchserveError as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return 2
    _print_summary(report)
    stages.finish(_closing_line(report))
    return 0


def spec_from_args(
    args: argparse.Namespace,
    inputs: Sequence[InputSpec] | None = None,
    outputs: Sequence[str] = (),
) -> ExportSpec:
    """The validated ExportSpec a command line describes.

    ``inputs`` and ``outputs`` are what the model declares (a Keras model does), used where the
    command line gives no ``--input`` or ``--output``.
    """
    serving = ServingOptions(
        dynamic_batching=args.dynamic_batching,
        max_queue_delay_us=args.max_queue_delay_us,
        preferred_batch_sizes=tuple(args.preferred_batch_sizes),
        sequence_length_input=args.sequence_length_input,
    )
    if args.inputs or inputs is None:
        inputs = tuple(parse_input_spec(text) for text in args.inputs)
    return ExportSpec(
        name=args.name,
        inputs=tuple(inputs),
        outputs=tuple(args.outputs or outputs),
        max_batch_size=args.max_batch_size,
        version=args.version,
        batch_sizes=parse_sizes(args.batch_sizes, option="--batch-sizes"),
        axis_sizes=parse_axis_sizes(args.axis_sizes),
        tolerance=_tolerance(args),
        opset=args.opset,
        serving=serving,
        image_input=_image_input(args, tuple(inputs)),
    )


def load_module(
    reference: str, kwargs_json: str | None = None, state_dict: Path | None = None
) -> torch.nn.Module:
    """Call ``package.module:attr`` with the JSON keyword arguments; load weights if given."""
    import torch

    factory = _resolve(reference)
    kwargs = _parse_kwargs(kwargs_json)
    try:
        module = factory(**kwargs)
    except Exception as exc:
        raise ExportError(f"FACTORY {reference} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, torch.nn.Module):
        kind = type(module).__name__
        raise ExportError(f"FACTORY {reference} returned a {kind}, not a torch.nn.Module")
    if state_dict is not None:
        _load_state_dict(module, state_dict, reference)
    return module


def _export(args: argparse.Namespace, stages: StageProgress) -> ExportReport:
    tensorrt = _tensorrt_options(args)
    if tensorrt is not None and args.format != "onnx":
        raise InvalidArgument("--tensorrt builds the engine from the ONNX model: use --format onnx")
    spec = _spec_before_loading(args, tensorrt)
    with stages.stage("load", args.model):
        module, spec = _load(args, spec)
    if tensorrt is not None:
        _check_profiles(spec, tensorrt)  # again: a Keras model's signature is known only now
    if spec.image_input is not None and not args.quiet:
        print(f"image sent as bytes: {spec.image_input}")
    progress = None if args.quiet else _print_verification
    repository = args.model_repository
    if args.format == "pt2":
        from batchserve.export.pt2 import export_pt2

        return export_pt2(module, spec, repository, progress=progress, stages=stages)
    if tensorrt is None:
        from batchserve.export.onnx import export_onnx

        return export_onnx(module, spec, repository, progress=progress, stages=stages)
    from batchserve.export.tensorrt import export_tensorrt

    return export_tensorrt(module, spec, repository, tensorrt, progress=progress, stages=stages)


def _spec_before_loading(
    args: argparse.Namespace, tensorrt: TensorRTOptions | None
) -> ExportSpec | None:
    """Check what can be checked before torch is imported; a factory's whole spec is known.

    A Keras model declares its own signature, so its spec waits until it is loaded (None).
    """
    spec = None
    if args.model.endswith(KERAS_SUFFIX):
        _check_keras_arguments(args)
    else:
        spec = spec_from_args(args)
    if tensorrt is not None:
        from batchserve.export.tensorrt import require_tensorrt

        if spec is not None:
            _check_profiles(spec, tensorrt)  # bad sizes fail before the GPU check
        require_tensorrt()
    return spec


def _load(args: argparse.Namespace, spec: ExportSpec | None) -> tuple[torch.nn.Module, ExportSpec]:
    """The module to export and its spec: a factory's is from the command line alone."""
    if spec is not None:
        return load_module(args.model, args.factory_kwargs, args.state_dict), spec
    from batchserve.export.keras_model import (
        KerasModel,
        keras_input_names,
        keras_model_inputs,
        keras_output_names,
        load_keras_model,
    )

    model = load_keras_model(Path(args.model))
    declared = None if args.inputs else keras_model_inputs(model, args.max_batch_size)
    spec = spec_from_args(args, declared, keras_output_names(model))
    names = keras_input_names(model) or [item.name for item in spec.inputs]
    return KerasModel(model, names), spec


def _check_profiles(spec: ExportSpec, tensorrt: TensorRTOptions) -> None:
    from batchserve.export.tensorrt import profile_shapes

    profile_shapes(spec, tensorrt.profile_batch_sizes)


def _check_keras_arguments(args: argparse.Namespace) -> None:
    if args.format == "pt2":
        raise InvalidArgument(
            "--format pt2 cannot take a Keras model: Keras names its weights like "
            "'conv2d/bias', which the server's check of a model.pt2 refuses; use --format onnx"
        )
    for option, value in (
        ("--factory-kwargs", args.factory_kwargs),
        ("--state-dict", args.state_dict),
    ):
        if value is not None:
            raise InvalidArgument(
                f"{option} is for a PyTorch factory; {args.model} is a Keras model file, which "
                "holds its own weights"
            )


def _image_input(args: argparse.Namespace, inputs: Sequence[InputSpec]) -> ImageInput | None:
    if not args.normalize:
        if args.layout is not None:
            raise InvalidArgument(
                "--layout says how an image sent as bytes is laid out: it needs --normalize"
            )
        return None
    return parse_normalize(args.normalize, args.layout, inputs)


def _tolerance(args: argparse.Namespace) -> Tolerance:
    given = {"atol": args.atol, "rtol": args.rtol}
    return Tolerance(**{key: value for key, value in given.items() if value is not None})


def _tensorrt_options(args: argparse.Namespace) -> TensorRTOptions | None:
    if not args.tensorrt:
        if args.fp16 or args.workspace_mib is not None or args.profile_batch_sizes:
            raise InvalidArgument(
                "--fp16, --workspace-mib and --profile-batch-sizes need --tensorrt"
            )
        return None
    from batchserve.export.tensorrt import FP16_TOLERANCE, TensorRTOptions

    tolerance = None
    if args.atol is not None or args.rtol is not None:
        tolerance = _tolerance(args)
        if args.fp16:  # what is not given keeps the FP16 default, not the FP32 one
            atol = FP16_TOLERANCE.fraction if args.atol is None else args.atol
            rtol = FP16_TOLERANCE.rtol if args.rtol is None else args.rtol
            tolerance = Tolerance(atol=atol, rtol=rtol)
    sizes: tuple[int, ...] = ()
    if args.profile_batch_sizes:
        sizes = parse_sizes(args.profile_batch_sizes, option="--profile-batch-sizes")
    return TensorRTOptions(
        fp16=args.fp16,
        workspace_mib=args.workspace_mib,
        tolerance=tolerance,
        profile_batch_sizes=sizes,
    )


def _resolve(reference: str) -> Callable[..., object]:
    module_name, sep, attr = reference.partition(":")
    if not (sep and module_name and attr):
        raise ExportError(
            f"FACTORY {reference!r} must look like package.module:attr (or be a Keras 3 file, "
            f"name{KERAS_SUFFIX})"
        )
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:
        raise ExportError(f"FACTORY {reference}: cannot import {module_name}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ExportError(f"FACTORY {reference}: {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ExportError(f"FACTORY {reference} is a {type(target).__name__}, not callable")
    return target


def _parse_kwargs(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"--factory-kwargs is not valid JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise InvalidArgument(f"--factory-kwargs must be a JSON object, not {text!r}")
    return kwargs


def _load_state_dict(module: torch.nn.Module, path: Path, reference: str) -> None:
    import torch

    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        message = first_line(exc)
        raise ExportError(
            f"--state-dict {path}: cannot load with weights_only: {message}"
        ) from None
    if not isinstance(state, Mapping):
        raise ExportError(f"--state-dict {path} holds a {type(state).__name__}, not a state dict")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        message = " ".join(str(exc).split())
        raise ExportError(f"--state-dict {path} does not fit {reference}: {message}") from None


def _print_verification(report: VerificationReport) -> None:
    for line in report.lines():
        print(line)


def _closing_line(report: ExportReport) -> str:
    """One sentence for the person at the terminal: what was written, and how well it held."""
    names = ", ".join(f"'{model.name}'" for model in report.models)
    checks = "; ".join(
        f"{m.verification.runtime} vs {m.verification.reference} within tolerance in "
        f"{len(m.verification.cases)} cases, max abs error {m.verification.max_abs:.3g}"
        for m in report.models
    )
    return f"exported {names} ({checks})"


def _print_summary(report: ExportReport) -> None:
    for note in report.warnings:
        print(f"note: exporter warning: {note}")
    for model in report.models:
        print(f"exported '{model.name}': {model.model_file}, {model.config_file}")
    for kind, tensors in (("input", report.signature.inputs), ("output", report.signature.outputs)):
        for tensor in tensors:
            print(f"  {kind} {tensor.name}: {tensor.datatype.wire}{list(tensor.shape)}")
    for model in report.models:
        check = model.verification
        print(
            f"  {check.runtime}: max abs error {check.max_abs:.3g}, max rel error "
            f"{check.max_rel:.3g} over {len(check.cases)} cases"
        )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="package.module:attr building a torch.nn.Module, or a Keras 3 model file (.keras)",
    )
    parser.add_argument("--name", required=True, help="model name in the repository")
    parser.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        metavar="SPEC",
        help="NAME:DTYPE:DIMS[:LOW..HIGH], e.g. tokens:INT64:batch,seq:0..95 (repeat per input; "
        "bound to forward's parameters by name, or by position when the names differ; a "
        "Keras model's own inputs when none is given)",
    )
    parser.add_argument("--state-dict", type=Path, help="weights, loaded with weights_only=True")
    parser.add_argument(
        "--factory-kwargs", metavar="JSON", help="keyword arguments for a MODEL factory"
    )
    parser.add_argument(
        "--output",
        dest="outputs",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME",
        help="output names (default output0, output1, ...)",
    )
    parser.add_argument(
        "--format",
        choices=("onnx", "pt2"),
        default="onnx",
        help="onnx: model.onnx for ONNX Runtime (default); pt2: model.pt2, a torch.export "
        "program for the pytorch backend (platform torch_export)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr and no per-case results: only what was written, and errors",
    )
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repo"))
    parser.add_argument("--max-batch-size", type=int, default=64, help="0: no batch axis")
    parser.add_argument("--opset", type=int, default=17)


def _add_image_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--normalize",
        nargs="+",
        metavar="KEY=VALUE",
        help="take a UINT8 image input as bytes and convert it inside the graph to the float "
        "NCHW tensor the module takes, (x * scale - mean) / std: mean=R,G,B std=R,G,B "
        "[scale=S (default 1/255)] [input=NAME (default: the only UINT8 input)]",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        help="the layout clients send the bytes in (default: told from where the 1, 3 or 4 "
        "channels sit in the input's dims)",
    )


def _add_test_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", default="1,3,8", help="batch sizes verified")
    parser.add_argument(
        "--axis-sizes",
        action="extend",
        nargs="+",
        default=[],
        metavar="AXIS=N,...",
        help="sizes verified for a named axis (default 1,7,33)",
    )
    parser.add_argument("--atol", type=float, help="absolute tolerance (default 1e-4)")
    parser.add_argument("--rtol", type=float, help="relative tolerance (default 1e-3)")


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dynamic-batching", action="store_true")
    parser.add_argument("--max-queue-delay-us", type=int, metavar="N")
    parser.add_argument(
        "--preferred-batch-size",
        dest="preferred_batch_sizes",
        type=int,
        action="extend",
        nargs="+",
        default=[],
        metavar="N",
    )
    parser.add_argument("--sequence-length-input", metavar="NAME")


def _add_tensorrt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensorrt", action="store_true", help="also build a TensorRT engine")
    parser.add_argument(
        "--fp16",
        action="store_true",
        help="allow FP16 kernels; the engine is then checked against the FP32 ONNX model with "
        "--atol as a fraction of each output's range (default 0.01) and --rtol (default 0.01)",
    )
    parser.add_argument("--workspace-mib", type=int, metavar="N")
    parser.add_argument(
        "--profile-batch-sizes",
        metavar="N,...",
        help="batch sizes to build one optimisation profile each for (default: the "
        "--preferred-batch-size values; without them one profile up to --max-batch-size)",
    )
