"""Triton-equivalent example models, built with onnx.helper, and a repository that serves them.

NVIDIA's Python client examples expect the models of Triton's docs repository
(``docs/examples/model_repository``) and QA generators: ``simple`` (INT32 add/sub),
``simple_string`` (the same over strings holding integers), ``simple_identity`` (BYTES
identity), ``simple_int8``, ``custom_identity_int32`` (memory_growth_test.py) and
``densenet_onnx`` (an image classifier with reshape and a label file). These are built
here with the same names, datatypes, dims, max_batch_size, reshape and label_filename;
their config.pbtxt files are written as Triton users write them. The classifier is a
small fixed-weight CNN, not DenseNet: the examples only check that the top classes the
server reports are the model's, which onnxruntime computes in-process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from batchserve.zoo.sequence_models import (
    write_simple_dyna_sequence,
    write_simple_sequence,
    write_string_dyna_sequence,
)
from onnx import TensorProto, helper, numpy_helper

from tests.integration.server import MODEL_REPO

OPSET = 17
CLASSES = 1000
IMAGE_SIZE = 224
SCALINGS = ("NONE", "INCEPTION", "VGG")
"""image_client.py's -s/--scaling modes."""
ADD_SUB_MODELS = ("simple", "simple_string", "simple_int8")
ONNX_MODELS = (*ADD_SUB_MODELS, "simple_identity", "custom_identity_int32", "densenet_onnx")
STATEFUL_MODELS = (
    "simple_sequence",
    "simple_dyna_sequence",
    "simple_string_dyna_sequence",
    "repeat_int32",
)
"""Triton's example sequence and decoupled models: the zoo's sequence models, and
repeat_int32 as shipped in model_repo/ (Triton's config, served by the built-in backend)."""
MODEL_NAMES = (*ONNX_MODELS, *STATEFUL_MODELS)
"""Every model the repository holds: the model-control examples count them."""

_ADD_SUB_TYPES = {
    "simple": (TensorProto.INT32, "TYPE_INT32"),
    "simple_string": (TensorProto.STRING, "TYPE_STRING"),
    "simple_int8": (TensorProto.INT8, "TYPE_INT8"),
}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # onnxruntime reads IR 8 at any version the project supports
    onnx.checker.check_model(model)
    return model


def add_sub(name: str) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over [batch, 16].

    ``simple_string`` parses its strings to INT32 and prints the results back, as
    Triton's QA string models do (ONNX ``Cast`` string<->int32).
    """
    elem, _ = _ADD_SUB_TYPES[name]
    shape: list[str | int] = ["batch", 16]
    inputs = [helper.make_tensor_value_info(f"INPUT{i}", elem, shape) for i in (0, 1)]
    outputs = [helper.make_tensor_value_info(f"OUTPUT{i}", elem, shape) for i in (0, 1)]
    a, b = "INPUT0", "INPUT1"
    nodes = []
    if elem == TensorProto.STRING:
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        ]
        a, b = "a", "b"
        nodes += [
            helper.make_node("Add", [a, b], ["sum"]),
            helper.make_node("Sub", [a, b], ["diff"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    else:
        nodes += [
            helper.make_node("Add", [a, b], ["OUTPUT0"]),
            helper.make_node("Sub", [a, b], ["OUTPUT1"]),
        ]
    return _model(helper.make_graph(nodes, name, inputs, outputs))


def identity(name: str, elem: int) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 over [batch, n]: simple_identity (BYTES), custom_identity_int32."""
    shape: list[str | int] = ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)],
    )
    return _model(graph)


def classifier() -> onnx.ModelProto:
    """A fixed-weight CNN with densenet_onnx's tensors: data_0 [1,3,224,224] -> fc6_1 [1,1000,1,1].

    Strided conv, ReLU, global average pool, then a 1x1 conv to 1000 logits, like the
    head of the real DenseNet; weights from a fixed seed so the top classes are stable.
    """
    rng = np.random.default_rng(20)
    conv = rng.normal(0, 0.05, (16, 3, 8, 8)).astype(np.float32)
    head = rng.normal(0, 0.5, (CLASSES, 16, 1, 1)).astype(np.float32)
    bias = rng.normal(0, 0.1, (CLASSES,)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["data_0", "conv_w"], ["c"], strides=[8, 8]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Conv", ["p", "fc_w", "fc_b"], ["fc6_1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "densenet_onnx",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, CLASSES, 1, 1])],
        initializer=[
            numpy_helper.from_array(conv, "conv_w"),
            numpy_helper.from_array(head, "fc_w"),
            numpy_helper.from_array(bias, "fc_b"),
        ],
    )
    return _model(graph)


def labels() -> list[str]:
    """densenet_labels.txt's shape: one upper-case label per class, 1000 lines."""
    return [f"CLASS_{i:04d}" for i in range(CLASSES)]


def _tensor(name: str, data_type: str, dims: str, extra: str = "") -> str:
    return (
        f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: [ {dims} ]{extra}\n  }}'
    )


def _config(name: str, max_batch: int, inputs: list[str], outputs: list[str]) -> str:
    """A config.pbtxt in the layout of Triton's docs repository."""
    sep = ",\n"
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f"input [\n{sep.join(inputs)}\n]\noutput [\n{sep.join(outputs)}\n]\n"
    )


def configs() -> dict[str, str]:
    """Each model's config.pbtxt text, as Triton's docs repository and QA write them."""
    done: dict[str, str] = {}
    for name in ADD_SUB_MODELS:
        _, data_type = _ADD_SUB_TYPES[name]
        ins = [_tensor(f"INPUT{i}", data_type, "16") for i in (0, 1)]
        outs = [_tensor(f"OUTPUT{i}", data_type, "16") for i in (0, 1)]
        done[name] = _config(name, 8, ins, outs)
    for name, data_type in (
        ("simple_identity", "TYPE_STRING"),
        ("custom_identity_int32", "TYPE_INT32"),
    ):
        ins, outs = [_tensor("INPUT0", data_type, "-1")], [_tensor("OUTPUT0", data_type, "-1")]
        done[name] = _config(name, 8, ins, outs)
    data = "\n    format: FORMAT_NCHW" + "\n    reshape { shape: [ 1, 3, 224, 224 ] }"
    fc = '\n    reshape { shape: [ 1, 1000, 1, 1 ] }\n    label_filename: "densenet_labels.txt"'
    done["densenet_onnx"] = _config(
        "densenet_onnx",
        0,
        [_tensor("data_0", "TYPE_FP32", "3, 224, 224", data)],
        [_tensor("fc6_1", "TYPE_FP32", "1000", fc)],
    )
    return done


def builders() -> dict[str, onnx.ModelProto]:
    """Each model's ONNX graph by name."""
    done = {name: add_sub(name) for name in ADD_SUB_MODELS}
    done["simple_identity"] = identity("simple_identity", TensorProto.STRING)
    done["custom_identity_int32"] = identity("custom_identity_int32", TensorProto.INT32)
    done["densenet_onnx"] = classifier()
    return done


def write_repository(root: Path) -> Path:
    """Write every model as ``<name>/config.pbtxt`` and ``<name>/1/model.onnx``."""
    texts = configs()
    for name, model in builders().items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(texts[name])
    (root / "densenet_onnx" / "densenet_labels.txt").write_text("\n".join(labels()) + "\n")
    write_simple_sequence(root)
    write_simple_dyna_sequence(root)
    write_string_dyna_sequence(root)
    shutil.copytree(MODEL_REPO / "repeat_int32", root / "repeat_int32")
    return root


def sample_image() -> np.ndarray:
    """A 224x224 RGB uint8 image (HWC), as PIL's ``np.array(img.convert('RGB'))`` gives.

    Stands in for the decoded, already 224x224 file image_client.py opens: PIL is not
    installed, and resizing a 224x224 image to 224x224 leaves it as it is.
    """
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    red = (x * 255) // (IMAGE_SIZE - 1)
    green = (y * 255) // (IMAGE_SIZE - 1)
    blue = ((x // 28 + y // 28) % 2) * 200 + 20
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def preprocess(pixels: np.ndarray, scaling: str) -> np.ndarray:
    """image_client.py's ``preprocess`` after its PIL steps, for FP32 NCHW (densenet_onnx).

    The same numpy operations in the same order: astype to the model dtype, then the
    INCEPTION or VGG scaling, then HWC -> CHW.
    """
    typed = pixels.astype(np.float32)
    if scaling == "INCEPTION":
        scaled = (typed / 127.5) - 1
    elif scaling == "VGG":
        scaled = typed - np.asarray((123, 117, 104), dtype=np.float32)
    else:
        scaled = typed
    return np.transpose(scaled, (2, 0, 1))
