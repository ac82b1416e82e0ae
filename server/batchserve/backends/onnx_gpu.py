"""What a GPU instance needs before its ONNX Runtime session exists: its own CUDA stream and
buffers, the batch sizes to capture CUDA graphs for, and the provider options saying so.

Decided from the config and the model file, without a session; what cannot be used (graphs
with the TensorRT provider, no cuda-python, no driver) becomes a warning, not a failure,
wherever the session can still run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from batchserve.backends.gpu_plan import graph_batch_sizes, preferred_sizes
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.onnx_io import CudaMemory, HostMemory, IoLayout, Memory, fixed_rows
from batchserve.backends.onnx_options import (
    TENSORRT_EP,
    ProviderPlan,
    tensorrt_profile,
    with_gpu_io,
)
from batchserve.core.device import Device
from batchserve.core.errors import BatchserveError, DeviceUnavailable, ModelConfigError
from batchserve.core.signature import ModelSignature
from batchserve.devices import cuda
from batchserve.proto.model_config_pb2 import ModelConfig

_GRAPH_REFUSED = re.compile(r"graph capture|cuda graph", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GpuSetup:
    """What an instance needs before its session exists: on a GPU, its stream and ORT options.

    Args:
        plan: the provider plan with the stream, graphs and TensorRT EP profile applied.
        memory: the instance's buffers (and stream): on the GPU with cuda-python, else host
            memory. It lives as long as the session, which may compute on its stream.
        graph_sizes: batch sizes to capture CUDA graphs for.
        warnings: why something the config asks for is not used.
    """

    plan: ProviderPlan
    memory: Memory
    graph_sizes: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()

    @classmethod
    def open(
        cls,
        plan: ProviderPlan,
        config: ModelConfig,
        model_file: Path,
        binds: bool,
        rollback: ExitStack,
    ) -> GpuSetup:
        """The setup for ``plan``; the memory it opens is closed by ``rollback`` when unwound."""
        if plan.device.kind != "gpu":
            host = HostMemory()
            rollback.callback(host.close)
            ignored = config.optimization.cuda.graphs
            note = f"{model_file}: optimization.cuda.graphs is ignored on the CPU"
            return cls(plan, host, warnings=(note,) if ignored else ())
        uses_trt = any(name == TENSORRT_EP for name, _ in plan.providers)
        sizes, signature, warnings = _usable_graph_sizes(config, model_file, binds, uses_trt)
        memory, problem = _gpu_memory(plan.device, config.optimization.cuda.busy_wait_events)
        rollback.callback(memory.close)
        if problem:
            warnings.append(f"{model_file}: {problem}")
        if sizes and not isinstance(memory, CudaMemory):
            _refuse_graphs_without_cuda_python(model_file, problem)
            sizes = ()  # no driver: the session's own failure reports the GPU as unusable
        plan = with_gpu_io(
            plan,
            stream=memory.stream.handle if isinstance(memory, CudaMemory) else None,
            cuda_graphs=bool(sizes),
            tensorrt_profile=_tensorrt_ep_profile(signature, config) if uses_trt else None,
        )
        return cls(plan, memory, sizes, tuple(warnings))


def _usable_graph_sizes(
    config: ModelConfig, model_file: Path, binds: bool, uses_trt: bool
) -> tuple[tuple[int, ...], ModelSignature | None, list[str]]:
    """The batch sizes ORT can capture graphs for, the file's signature when it was needed,
    and why sizes the config asks for cannot be captured."""
    sizes = graph_batch_sizes(config, model_file)
    signature = read_onnx_signature(model_file) if sizes or uses_trt else None
    warnings: list[str] = []
    if sizes and uses_trt:
        warnings.append(
            f"{model_file}: optimization.cuda.graphs is not used with the tensorrt "
            "accelerator: ONNX Runtime's TensorRT provider holds one CUDA graph per session "
            "and replays it whatever the batch size. Serve a TensorRT engine "
            "(batchserve export --tensorrt) for a graph per batch size"
        )
        sizes = ()
    if sizes and not (binds and _graphable(signature, config)):
        warnings.append(
            f"{model_file}: optimization.cuda.graphs needs I/O binding and every input "
            "and output fixed apart from the batch axis; running without CUDA graphs"
        )
        sizes = ()
    return sizes, signature, warnings


def _graphable(signature: ModelSignature | None, config: ModelConfig) -> bool:
    return signature is not None and IoLayout.plan(signature, config.max_batch_size).complete


def _tensorrt_ep_profile(signature: ModelSignature | None, config: ModelConfig) -> dict[str, str]:
    """An explicit profile when every input is fixed apart from the batch axis, else none."""
    if signature is None:
        return {}
    rows = [fixed_rows(spec) for spec in signature.inputs]
    fixed = [(r.name, r.row_shape) for r in rows if r is not None]
    if len(fixed) != len(rows):
        return {}
    return tensorrt_profile(fixed, config.max_batch_size, preferred_sizes(config))


def _gpu_memory(device: Device, busy_wait: bool) -> tuple[Memory, str]:
    """CudaMemory for the device, or host memory and why not (ORT then does the copies);
    ``busy_wait``: its thread spins while the GPU works (``cuda.Stream``)."""
    try:
        cuda.runtime()
    except DeviceUnavailable:
        return HostMemory(), (
            "cuda-python is not installed: ONNX Runtime copies every batch through pageable "
            "host memory on a stream of its own, without CUDA graphs; pip install "
            "'batchserve[gpu]' for pinned buffers and a stream per instance"
        )
    try:
        return CudaMemory(device.index, busy_wait), ""
    except DeviceUnavailable as exc:  # no driver: the session will say so too
        return HostMemory(), f"no CUDA stream on {device}: {exc.message}"


def _refuse_graphs_without_cuda_python(model_file: Path, problem: str) -> None:
    if problem.startswith("cuda-python is not installed"):
        raise DeviceUnavailable(
            f"{model_file}: optimization.cuda.graphs needs cuda-python, which is not installed "
            "(pip install 'batchserve[gpu]'), or set optimization { cuda { graphs: false } }"
        )


@contextmanager
def graph_hint(graph_sizes: tuple[int, ...], model_file: Path) -> Iterator[None]:
    """ORT refuses graph capture for models with nodes off the GPU: say how to go on."""
    try:
        yield
    except BatchserveError as exc:
        if not graph_sizes or not _GRAPH_REFUSED.search(exc.message):
            raise
        config_file = model_file.parent.parent / "config.pbtxt"
        raise ModelConfigError(
            f"{exc.message}; CUDA graphs need every node on the GPU provider and no control "
            f"flow: set optimization {{ cuda {{ graphs: false }} }} in {config_file}"
        ) from exc
