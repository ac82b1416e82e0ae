"""The same two models for every GPU runtime, written into a model repository.

- ``wide``: x[batch, 8] -> y[batch, 1], the mean of ``WIDE`` copies of x[:, 0]: every sample
  materialises ``WIDE`` floats (128 MiB), so memory grows with the batch, and y == x[:, :1].
- ``chain``: x[batch, 256] -> ``DEPTH`` x (MatMul 256x256, Tanh): many small kernels, each
  using a few of the GPU's multiprocessors, so two instances have room to overlap.

Each is a torch.export program (``pytorch``), an ONNX graph (``onnxruntime``) or a TensorRT
engine built from that graph (``tensorrt``). Which runtimes this machine has is
``absent(runtime)``: None, or why not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
from batchserve.core.errors import DeviceUnavailable
from batchserve.devices import cuda
from batchserve.devices.placement import gpu_count
from onnx import TensorProto, helper, numpy_helper

RUNTIMES = ("pytorch", "onnxruntime", "tensorrt")
FILENAMES = {"pytorch": "model.pt2", "onnxruntime": "model.onnx", "tensorrt": "model.plan"}
WIDE = 32 * 2**20  # floats per sample: 128 MiB
WIDE_ROW = 8
CHAIN_WIDTH = 256
DEPTH = 100
_WEIGHTS = np.random.default_rng(0).standard_normal((DEPTH, CHAIN_WIDTH, CHAIN_WIDTH))
CHAIN_WEIGHTS = (_WEIGHTS / np.sqrt(CHAIN_WIDTH)).astype(np.float32)


def absent(runtime: str) -> str | None:
    """Why ``runtime`` cannot run on a GPU here, or None when it can."""
    if gpu_count() == 0:
        return "no NVIDIA GPU is visible (NVML sees none)"
    if runtime == "pytorch":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA"
    elif runtime == "onnxruntime":
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed"
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "onnxruntime-gpu is not installed (no CUDAExecutionProvider)"
    elif importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed"
    else:
        try:
            cuda.runtime()
        except DeviceUnavailable:
            return "cuda-python is not installed"
    return None


def write_model(
    runtime: str, repository: Path, name: str, kind: str, config: str, max_batch: int
) -> Path:
    """``<repository>/<name>/1/<file>`` and its config.pbtxt; returns the model file."""
    model_file = repository / name / "1" / FILENAMES[runtime]
    model_file.parent.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(f"max_batch_size: {max_batch}\n{config}")
    if runtime == "pytorch":
        _write_program(model_file, kind, max_batch)
        return model_file
    graph = _wide_graph() if kind == "wide" else _chain_graph()
    if runtime == "onnxruntime":
        onnx.save(graph, str(model_file))
        return model_file
    width = WIDE_ROW if kind == "wide" else CHAIN_WIDTH
    return _build_engine(graph, model_file, width, max_batch)


def _write_program(path: Path, kind: str, max_batch: int) -> None:
    import torch

    module = _wide_module() if kind == "wide" else _chain_module()
    width = WIDE_ROW if kind == "wide" else CHAIN_WIDTH
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    example = (torch.ones(2, width),)
    program = torch.export.export(module.eval(), example, dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))


def _wide_module() -> object:
    import torch

    class Wide(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            copies = x[:, :1].expand(x.shape[0], WIDE).contiguous()
            return {"y": copies.mean(dim=1, keepdim=True)}

    return Wide()


def _chain_module() -> object:
    import torch

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[torch.nn.Module] = []
            for weight in CHAIN_WEIGHTS:
                linear = torch.nn.Linear(CHAIN_WIDTH, CHAIN_WIDTH, bias=False)
                linear.weight.data = torch.from_numpy(weight.T.copy())  # x @ W, as in ONNX
                layers += [linear, torch.nn.Tanh()]
            self.layers = torch.nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"y": self.layers(x)}

    return Chain()


def _model(
    nodes: list[onnx.NodeProto], width: int, out_width: int, weights: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "promise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_width])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _wide_graph() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Slice", ["x", "zero", "one", "one"], ["first"]),  # x[:, 0:1]
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("Concat", ["rows", "wide"], ["target"], axis=0),
        helper.make_node("Expand", ["first", "target"], ["copies"]),
        helper.make_node("ReduceMean", ["copies"], ["y"], axes=[1], keepdims=1),
    ]
    weights = {
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "wide": np.array([WIDE], np.int64),
    }
    return _model(nodes, WIDE_ROW, 1, weights)


def _chain_graph() -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    previous = "x"
    for layer in range(DEPTH):
        last = layer == DEPTH - 1
        nodes.append(helper.make_node("MatMul", [previous, f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"m{layer}"], ["y" if last else f"t{layer}"]))
        previous = f"t{layer}"
    weights = {f"w{i}": CHAIN_WEIGHTS[i] for i in range(DEPTH)}
    return _model(nodes, CHAIN_WIDTH, CHAIN_WIDTH, weights)


def _build_engine(graph: onnx.ModelProto, plan: Path, width: int, max_batch: int) -> Path:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(graph.SerializeToString()), parser.get_error(0)
    build_config = builder.create_builder_config()
    build_config.clear_flag(trt.BuilderFlag.TF32)  # FP32, as the other runtimes compute
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, width), (max(1, max_batch // 2), width), (max_batch, width))
    build_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, build_config)
    assert serialized is not None, "TensorRT could not build the engine"
    plan.write_bytes(bytes(serialized))
    return plan


def chain_reference(x: np.ndarray) -> np.ndarray:
    """What the chain model computes, in numpy (float64, then float32)."""
    y = x.astype(np.float64)
    for weight in CHAIN_WEIGHTS:
        y = np.tanh(y @ weight)
    return y.astype(np.float32)
