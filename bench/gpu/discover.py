"""Which runtimes this machine can run, and for each one it cannot, why.

ONNX Runtime on the GPU means CUDAExecutionProvider among the providers *and* a session that
really runs on it (the provider is listed by onnxruntime-gpu even where its CUDA or cuDNN
libraries do not load, and the session then falls back to the CPU). TensorRT means
``import tensorrt`` and cuda-python; PyTorch means ``torch.cuda.is_available()`` plus a
``batchserve export --format pt2`` and a server that serves ``model.pt2``. The reasons are
built by small pure functions so that each wording is tested.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu.records import RuntimeStatus
from bench.gpu.runtimes import RuntimeSpec

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
CPU_MODE = "GPU runtime: not tried in the CPU dry run"


def ort_reason(
    version: str, providers: Sequence[str], ran_on: Sequence[str] | None, provider: str
) -> str:
    """Why ONNX Runtime cannot run on ``provider`` here ("" when it can).

    ``ran_on``: the providers of a probe session asked for ``provider`` (None: not probed).
    """
    if provider not in providers:
        build = "onnxruntime-gpu" if provider == CUDA_EP else "an onnxruntime build with it"
        listed = ", ".join(providers) or "none"
        return f"onnxruntime {version} has no {provider} (providers: {listed}); it needs {build}"
    if ran_on is not None and (not ran_on or ran_on[0] != provider):
        fell = ran_on[0] if ran_on else "nothing"
        return (
            f"onnxruntime {version} lists {provider}, but a session ran on {fell}: the CUDA "
            "or cuDNN libraries it was built for did not load"
        )
    return ""


def tensorrt_reason(import_error: str, has_cuda_python: bool) -> str:
    if import_error:
        return f"import tensorrt failed: {import_error}"
    if not has_cuda_python:
        return "tensorrt imports, but cuda-python (cuda.bindings) is missing: the backend needs it"
    return ""


def torch_reason(version: str, built_cuda: str | None, available: bool, gpu: bool) -> str:
    """Why PyTorch cannot run the model where the mode needs it ("" when it can)."""
    if not gpu:
        return ""
    if built_cuda is None:
        return f"torch {version} is a CPU-only build (torch.version.cuda is None)"
    if not available:
        return f"torch {version} (CUDA {built_cuda}): torch.cuda.is_available() is False"
    return ""


def pt2_reason(export_help: str, serves_pt2: str) -> str:
    """Why this checkout cannot export and serve pt2 programs ("" when it can).

    ``serves_pt2``: the server's refusal of a ``model.pt2`` file ("" when it takes one).
    """
    if "pt2" not in export_help or "--format" not in export_help:
        return "batchserve export has no --format pt2 in this checkout"
    if serves_pt2:
        return f"batchserve cannot serve model.pt2 here: {serves_pt2}"
    return ""


def discover(specs: Sequence[RuntimeSpec], cpu: bool) -> list[RuntimeStatus]:
    """One status per runtime of the mode; GPU runtimes are listed as not tried in CPU mode."""
    found = []
    for spec in specs:
        version, reason = _probe(spec)
        found.append(RuntimeStatus(spec.key, spec.label, not reason, version, reason))
    if cpu:
        from bench.gpu.runtimes import GPU_RUNTIMES

        found += [RuntimeStatus(s.key, s.label, False, "", CPU_MODE) for s in GPU_RUNTIMES]
    return found


def _probe(spec: RuntimeSpec) -> tuple[str, str]:
    if spec.filename == "model.onnx":
        return _onnxruntime(CUDA_EP if spec.device == "gpu" else CPU_EP)
    if spec.filename == "model.plan":
        return _tensorrt()
    return _pt2(spec.device == "gpu")


def _onnxruntime(provider: str) -> tuple[str, str]:
    try:
        import onnxruntime
    except ImportError as exc:
        return "", f"onnxruntime is not installed ({exc})"
    providers = onnxruntime.get_available_providers()
    version = str(onnxruntime.__version__)
    ran_on = _session_providers(onnxruntime, provider) if provider in providers else None
    return version, ort_reason(version, providers, ran_on, provider)


def _session_providers(onnxruntime: Any, provider: str) -> list[str]:
    """The providers a one-node session asked for ``provider`` really got."""
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    try:
        providers = list(dict.fromkeys([provider, CPU_EP]))
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=providers)
    except Exception:
        return []
    return list(session.get_providers())


def _tensorrt() -> tuple[str, str]:
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as exc:  # ImportError, or a missing shared library behind it
        return "", tensorrt_reason(str(exc) or type(exc).__name__, False)
    has_cuda = importlib.util.find_spec("cuda") is not None and _has("cuda.bindings")
    return str(getattr(trt, "__version__", "")), tensorrt_reason("", has_cuda)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _pt2(gpu: bool) -> tuple[str, str]:
    try:
        import torch
    except ImportError as exc:
        return "", f"torch is not installed ({exc})"
    version = str(torch.__version__)
    available = bool(torch.cuda.is_available()) if gpu else False
    reason = torch_reason(version, torch.version.cuda, available, gpu)
    return version, reason or pt2_reason(export_help(), _pt2_refusal())


def export_help() -> str:
    """``batchserve export --help``, as this checkout prints it."""
    done = subprocess.run(
        [sys.executable, "-m", "batchserve.cli", "export", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.stdout


def _pt2_refusal() -> str:
    from batchserve.backends.selection import runtime_name
    from batchserve.core.errors import BatchserveError
    from batchserve.proto.model_config_pb2 import ModelConfig

    try:
        runtime_name(ModelConfig(), Path("model.pt2"))
    except BatchserveError as exc:
        return str(exc.message)
    return ""
