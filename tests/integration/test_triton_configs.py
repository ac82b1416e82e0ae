"""Triton-style models and configs, served by a real server, called with NVIDIA's clients.

Each model is built here with ``onnx.helper`` and described by a config.pbtxt written as
Triton's model repositories write them: a string model like Triton's ``simple_string``, a
model whose config reshapes like ``densenet_onnx``, one with an input the file gives a
default for, a model of scalars written as Triton writes them (``dims: [ 1 ]``), one with
tensors of nothing but a batch axis left for the server to complete (as a scikit-learn
classifier exported by skl2onnx has), and configs asking for what batchserve does not do.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, start_server

OPSET = [helper.make_opsetid("", 13)]

SIMPLE_STRING = """
name: "simple_string"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
"""

# The same model, warmed up from a file of length-prefixed strings, as Triton's L0_warmup does.
STRING_WARMUP = (
    SIMPLE_STRING.replace('"simple_string"', '"string_warmup"')
    + """
model_warmup [{
  name: "from file"
  batch_size: 2
  count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 16 ] input_data_file: "raw" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_STRING dims: [ 16 ] input_data_file: "raw" } }
}]
"""
)

RESHAPED = """
name: "reshaped"
max_batch_size: 0
input [{
  name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW
  dims: [ 3, 4, 4 ] reshape { shape: [ 1, 3, 4, 4 ] }
}]
output [{ name: "pool" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 1, 3, 1, 1 ] } }]
"""

DEFAULTED = """
name: "defaulted"
max_batch_size: 0
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]
"""

ONLY_DEFAULTED = """
name: "only_defaulted"
max_batch_size: 0
input [{ name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]
"""

# A model of scalars as Triton's ONNX Runtime backend completes and accepts it: dims [ 1 ],
# no reshape (Triton refuses an empty reshape in a model that does not batch).
SCALARS = """
name: "scalars"
max_batch_size: 0
input [{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 1, 1 ] }]
"""

DECOUPLED = """
name: "decoupled"
max_batch_size: 0
model_transaction_policy { decoupled: true }
"""

SEQUENCE = """
name: "sequence"
max_batch_size: 8
sequence_batching { max_sequence_idle_microseconds: 5000000 iterative_sequence: true }
"""


def _save(model: onnx.ModelProto, repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config)


def _string_model() -> onnx.ModelProto:
    """Triton's simple_string: strings holding integers in, their sum and difference out."""
    tensor = helper.make_tensor_value_info
    inputs = [tensor(n, TensorProto.STRING, [None, 16]) for n in ("INPUT0", "INPUT1")]
    outputs = [tensor(n, TensorProto.STRING, [None, 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    graph = helper.make_graph(nodes, "simple_string", inputs, outputs)
    return helper.make_model(graph, opset_imports=OPSET)


def _pool_model() -> onnx.ModelProto:
    """Sees [1, 3, 4, 4] and answers [1, 3, 1, 1], as densenet_onnx's file does."""
    tensor = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["data_0"], ["pool"])],
        "pool",
        [tensor("data_0", TensorProto.FLOAT, [1, 3, 4, 4])],
        [tensor("pool", TensorProto.FLOAT, [1, 3, 1, 1])],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _defaulted_model(with_x: bool) -> onnx.ModelProto:
    """y = x + bias (or y = bias), where bias is a graph input an initializer backs."""
    tensor = helper.make_tensor_value_info
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [4], [10.0, 20.0, 30.0, 40.0])
    inputs = [tensor("bias", TensorProto.FLOAT, [4])]
    if with_x:
        inputs.insert(0, tensor("x", TensorProto.FLOAT, [4]))
        node = helper.make_node("Add", ["x", "bias"], ["y"])
    else:
        node = helper.make_node("Identity", ["bias"], ["y"])
    graph = helper.make_graph(
        [node], "defaulted", inputs, [tensor("y", TensorProto.FLOAT, [4])], [bias]
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _scalar_model() -> onnx.ModelProto:
    """y = 2x, x and y scalars (rank 0)."""
    tensor = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "scalars",
        [tensor("x", TensorProto.FLOAT, [])],
        [tensor("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _classifier_model() -> onnx.ModelProto:
    """A classifier's signature as skl2onnx writes it: scores [N, 4] and an offset [N] in,
    a label [N] (int64) and probabilities [N, 4] out; N is a dim with no name or size."""
    tensor = helper.make_tensor_value_info
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Unsqueeze", ["offset", "axes"], ["column"]),
        helper.make_node("Add", ["scores", "column"], ["shifted"]),
        helper.make_node("Softmax", ["shifted"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [
            tensor("scores", TensorProto.FLOAT, [None, 4]),
            tensor("offset", TensorProto.FLOAT, [None]),
        ],
        [
            tensor("label", TensorProto.INT64, [None]),
            tensor("probabilities", TensorProto.FLOAT, [None, 4]),
        ],
        [axes],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _string_file(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(value)) + value for value in values)


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("triton_configs")
    _save(_string_model(), repo, "simple_string", SIMPLE_STRING)
    _save(_string_model(), repo, "string_warmup", STRING_WARMUP)
    (repo / "string_warmup" / "warmup").mkdir()
    raw = _string_file([str(i).encode() for i in range(16)])
    (repo / "string_warmup" / "warmup" / "raw").write_bytes(raw)
    _save(_pool_model(), repo, "reshaped", RESHAPED)
    _save(_defaulted_model(True), repo, "defaulted", DEFAULTED)
    _save(_defaulted_model(False), repo, "only_defaulted", ONLY_DEFAULTED)
    _save(_defaulted_model(True), repo, "decoupled", DECOUPLED)
    _save(_string_model(), repo, "sequence", SEQUENCE)
    _save(_scalar_model(), repo, "scalars", SCALARS)
    (repo / "classifier" / "1").mkdir(parents=True)  # no config: the server completes it
    onnx.save(_classifier_model(), str(repo / "classifier" / "1" / "model.onnx"))
    # two models are meant to fail; verbose, for Triton's warm-up lines
    server = start_server(repo, ["--log-verbose", "1"], wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        yield server
    finally:
        assert server.stop() == 0


def _http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def _grpc(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _module_and_client(server: ServerProcess, protocol: str) -> tuple[Any, Any]:
    """tritonclient's module for ``protocol`` (for its InferInput) and a client of it."""
    if protocol == "http":
        return httpclient, _http(server)
    return grpcclient, _grpc(server)


def _fp32_infer(server: ServerProcess, protocol: str, model: str, **arrays: np.ndarray) -> Any:
    """The model's answer to FP32 ``arrays`` by name, sent with tritonclient."""
    module, client = _module_and_client(server, protocol)
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array.astype(np.float32))
        inputs.append(tensor)
    return client.infer(model, inputs)


def _string_inputs(module: object, a: np.ndarray, b: np.ndarray) -> list[object]:
    inputs = [
        module.InferInput("INPUT0", list(a.shape), "BYTES"),  # type: ignore[attr-defined]
        module.InferInput("INPUT1", list(b.shape), "BYTES"),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.mark.parametrize("model", ["simple_string", "string_warmup"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_model_loads_and_adds(
    triton_server: ServerProcess, model: str, protocol: str
) -> None:
    """As NVIDIA's simple_http_string_infer_client.py does it: integers sent as strings."""
    module, client = _module_and_client(triton_server, protocol)
    assert client.is_model_ready(model)
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    a = np.array([str(x).encode() for x in in0.reshape(-1)], dtype=object).reshape(1, 16)
    b = np.array([str(x).encode() for x in in1.reshape(-1)], dtype=object).reshape(1, 16)
    result = client.infer(model, _string_inputs(module, a, b))
    total = result.as_numpy("OUTPUT0")
    difference = result.as_numpy("OUTPUT1")
    assert [int(x) for x in total.reshape(-1)] == list(in0.reshape(-1) + 1)
    assert [int(x) for x in difference.reshape(-1)] == list(in0.reshape(-1) - 1)


@pytest.mark.parametrize(("sent", "text"), [
    (14, r"expected 16 string elements for inference input 'INPUT[01]' for model "
         r"'simple_string', got 14"),
    (18, r"unexpected number of string elements 17 for inference input 'INPUT[01]' for model "
         r"'simple_string', expecting 16"),
])  # fmt: skip
def test_string_elements_of_a_compromised_shape_get_tritons_text(
    triton_server: ServerProcess, sent: int, text: str
) -> None:
    """Triton's own test of this (L0_input_validation ``test_input_string_shape_validation``):
    elements for one shape, then the shape set to another. Triton names whichever input its
    hash map holds first (INPUT1 there); batchserve names the first in the request."""
    values = np.array([str(i).encode() for i in range(sent)], dtype=object).reshape(1, sent)
    inputs = _string_inputs(grpcclient, values, values)
    for tensor in inputs:
        tensor.set_shape([1, 16])  # type: ignore[attr-defined]
    with pytest.raises(InferenceServerException) as caught:
        _grpc(triton_server).infer("simple_string", inputs)
    assert re.search(text, str(caught.value)), str(caught.value)


def test_string_model_refuses_non_integers(triton_server: ServerProcess) -> None:
    """The model's own parse failure is an error for that request; the model stays up."""
    a = np.full((1, 16), b"seven", dtype=object)
    with pytest.raises(InferenceServerException):
        _http(triton_server).infer("simple_string", _string_inputs(httpclient, a, a))
    assert _http(triton_server).is_model_ready("simple_string")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_reshape_is_applied_both_ways(triton_server: ServerProcess, protocol: str) -> None:
    module, client = _module_and_client(triton_server, protocol)
    data = np.arange(48, dtype=np.float32).reshape(3, 4, 4)
    tensor = module.InferInput("data_0", [3, 4, 4], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(data)
    result = client.infer("reshaped", [tensor])
    pooled = result.as_numpy("pool")
    assert pooled.shape == (3,)
    np.testing.assert_allclose(pooled, data.mean(axis=(1, 2)))
    metadata = client.get_model_metadata("reshaped")
    shapes = (
        [list(map(int, t["shape"])) for t in metadata["inputs"]]
        if protocol == "http"
        else [list(t.shape) for t in metadata.inputs]
    )
    assert shapes == [[3, 4, 4]]


def _shapes(metadata: object, kind: str, protocol: str) -> dict[str, list[int]]:
    if protocol == "http":
        return {t["name"]: list(map(int, t["shape"])) for t in metadata[kind]}  # type: ignore[index]
    return {t.name: list(t.shape) for t in getattr(metadata, kind)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_scalars_written_as_dims_of_one_are_served_as_triton_serves_them(
    triton_server: ServerProcess, protocol: str
) -> None:
    _, client = _module_and_client(triton_server, protocol)
    y = _fp32_infer(triton_server, protocol, "scalars", x=np.array([2.5])).as_numpy("y")
    assert y.shape == (1, 1)
    assert y[0, 0] == 5.0
    metadata = client.get_model_metadata("scalars")
    assert _shapes(metadata, "inputs", protocol) == {"x": [1]}
    assert _shapes(metadata, "outputs", protocol) == {"y": [1, 1]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_completed_batch_only_tensor_takes_one_value_a_sample_as_triton_completes_it(
    triton_server: ServerProcess, protocol: str
) -> None:
    """Triton completes a tensor of shape [N] as dims [1] with an empty reshape: clients send
    and receive [N, 1]."""
    _, client = _module_and_client(triton_server, protocol)
    metadata = client.get_model_metadata("classifier")
    assert _shapes(metadata, "inputs", protocol) == {"scores": [-1, 4], "offset": [-1, 1]}
    assert _shapes(metadata, "outputs", protocol) == {"label": [-1, 1], "probabilities": [-1, 4]}
    scores = np.array([[0, 1, 0, 0], [0, 0, 0, 3], [2, 0, 0, 0]], dtype=np.float32)
    offset = np.array([[0.5], [0], [-1]], dtype=np.float32)
    result = _fp32_infer(triton_server, protocol, "classifier", scores=scores, offset=offset)
    np.testing.assert_array_equal(result.as_numpy("label"), [[1], [3], [0]])
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (3, 4)
    expected = np.exp(scores + offset) / np.exp(scores + offset).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5)
    config = client.get_model_config("classifier")
    if protocol == "http":
        (label,) = [o for o in config["output"] if o["name"] == "label"]
        assert (label["dims"], label["reshape"]) == ([1], {"shape": []})
    else:
        (label,) = [o for o in config.config.output if o.name == "label"]
        assert list(label.dims) == [1]
        assert label.HasField("reshape")
        assert list(label.reshape.shape) == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_optional_input_may_be_left_out_or_sent(
    triton_server: ServerProcess, protocol: str
) -> None:
    x = np.ones(4)
    defaulted = _fp32_infer(triton_server, protocol, "defaulted", x=x).as_numpy("y")
    np.testing.assert_array_equal(defaulted, [11.0, 21.0, 31.0, 41.0])
    bias = np.full(4, 2.0)
    sent = _fp32_infer(triton_server, protocol, "defaulted", x=x, bias=bias).as_numpy("y")
    np.testing.assert_array_equal(sent, [3.0, 3.0, 3.0, 3.0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_with_no_inputs(triton_server: ServerProcess, protocol: str) -> None:
    """Accepted when every input is optional; otherwise Triton's words, then ours."""
    client = _http(triton_server) if protocol == "http" else _grpc(triton_server)
    answer = client.infer("only_defaulted", []).as_numpy("y")
    np.testing.assert_array_equal(answer, [10.0, 20.0, 30.0, 40.0])
    with pytest.raises(InferenceServerException) as caught:
        client.infer("defaulted", [])
    message = caught.value.message()
    assert "expected number of inputs between 1 and 2 but got 0 inputs for model 'defaulted'" in (
        message
    )
    assert "missing required input(s) ['x']" in message


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("decoupled", "field 'model_transaction_policy.decoupled' is true"),
        ("sequence", "field 'sequence_batching.iterative_sequence' is true"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(
    triton_server: ServerProcess, model: str, field: str
) -> None:
    assert not _http(triton_server).is_model_ready(model)
    failures = {
        str(r["model"]): str(r["reason"])
        for r in triton_server.logs
        if r.get("message") == "model failed to load"
    }
    assert set(failures) == {"decoupled", "sequence"}
    assert failures[model].startswith(f"{model}/config.pbtxt: {field}")
    assert "batchserve does not support" in failures[model]


def test_model_warmup_samples_are_reported_in_the_log(triton_server: ServerProcess) -> None:
    triton_server.drain_logs()
    runs = [r for r in triton_server.logs if r.get("message") == "warm-up sample run"]
    assert runs, "no warm-up sample was logged"
    assert {(r["sample"], r["count"]) for r in runs} == {("from file", 2)}, runs
    assert all(str(r["instance"]).startswith("string_warmup-1-") for r in runs), runs
    assert all(float(str(r["ms"])) >= 0 for r in runs)
    # Triton's verbose line for each run (L0_warmup greps for it), one per iteration
    lines = [
        str(r["message"])
        for r in triton_server.logs
        if "is running warmup sample" in str(r["message"])
    ]
    instance = str(runs[0]["instance"])
    assert lines == [
        f"model 'string_warmup' instance {instance} is running warmup sample 'from file' "
        f"for iteration {iteration}"
        for iteration in (1, 2)
    ], lines
