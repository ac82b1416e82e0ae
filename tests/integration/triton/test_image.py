"""The image-classification examples (image_client.py, grpc_image_client.py, grpc_client.py).

They query densenet_onnx's metadata and config, check it is an image classifier
(one FP32 input of 3 dims in NCHW or NHWC, one vector output), send a preprocessed image
and print the top ``-c`` classes as "value:index:label". PIL is not installed, so the
image is built with numpy as the example's ``preprocess`` leaves it: a 224x224 RGB array
(what PIL's resize to the model's 224x224 gives for a 224x224 image), cast to FP32,
scaled (NONE, INCEPTION or VGG) and transposed to CHW. The expected classes come from
onnxruntime running the same model file in-process.
"""

from __future__ import annotations

import queue
import re
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import TIMEOUT, grpc_client, http_client
from tests.integration.triton.models import SCALINGS, labels, preprocess, sample_image

MODEL = "densenet_onnx"
VALUE = re.compile(r"-?\d+\.\d{6}")
"""Triton prints a class's value with std::to_string: six decimals (src/classification.cc)."""


def _expected(repo: Path, scaling: str, count: int) -> list[tuple[float, int, str]]:
    """The top ``count`` (value, index, label) of the model file, run in-process."""
    session = ort.InferenceSession(str(repo / MODEL / "1" / "model.onnx"))
    logits = session.run(None, {"data_0": preprocess(sample_image(), scaling)[np.newaxis]})[0]
    flat = logits.reshape(-1)
    top = np.argsort(-flat, kind="stable")[:count]
    return [(float(flat[i]), int(i), labels()[i]) for i in top]


def _parse_model(metadata: Any, config: Any) -> tuple[int, str, str, int, int, int, int, str]:
    """image_client.py's parse_model: the checks that the model is an image classifier."""
    assert len(metadata["inputs"]) == 1, metadata
    assert len(metadata["outputs"]) == 1, metadata
    assert len(config["input"]) == 1, config
    input_metadata, input_config = metadata["inputs"][0], config["input"][0]
    output_metadata = metadata["outputs"][0]
    assert output_metadata["datatype"] == "FP32", output_metadata
    batch_dim = config.get("max_batch_size", 0) > 0
    output_dims = output_metadata["shape"][1:] if batch_dim else output_metadata["shape"]
    assert sum(1 for d in output_dims if d > 1) <= 1, (
        f"expecting a vector output: {output_metadata}"
    )
    assert len(input_metadata["shape"]) == 3 + batch_dim, input_metadata
    layout = input_config.get("format", "FORMAT_NONE")
    layout = mc.ModelInput.Format.Value(layout) if isinstance(layout, str) else layout
    assert layout in (mc.ModelInput.FORMAT_NCHW, mc.ModelInput.FORMAT_NHWC), input_config
    dims = input_metadata["shape"][batch_dim:]
    c, h, w = dims if layout == mc.ModelInput.FORMAT_NCHW else (dims[2], dims[0], dims[1])
    return (
        config.get("max_batch_size", 0),
        input_metadata["name"],
        output_metadata["name"],
        c,
        h,
        w,
        layout,
        input_metadata["datatype"],
    )


def _as_dicts(metadata: Any, config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """gRPC messages as the JSON dicts HTTP returns, so one parse_model serves both."""
    from google.protobuf.json_format import MessageToDict

    meta = MessageToDict(metadata, preserving_proto_field_name=True)
    for tensor in meta.get("inputs", []) + meta.get("outputs", []):
        tensor["shape"] = [int(d) for d in tensor["shape"]]
    conf = MessageToDict(config, preserving_proto_field_name=True)
    conf["max_batch_size"] = config.max_batch_size
    return meta, conf


def _check_classes(classes: np.ndarray, expected: list[tuple[float, int, str]]) -> None:
    """postprocess(): each class is "value:index:label", the top ``-c`` in order."""
    assert list(classes.shape) == [len(expected)], classes
    for entry, (value, index, label) in zip(classes, expected, strict=True):
        text = entry.decode() if isinstance(entry, bytes) else "".join(chr(x) for x in entry)
        cls = text.split(":")
        assert len(cls) == 3, text
        assert VALUE.fullmatch(cls[0]), f"value not printed as Triton prints it: {text}"
        assert float(cls[0]) == pytest.approx(value, rel=1e-4, abs=1e-4), (text, value)
        assert (int(cls[1]), cls[2]) == (index, label), (text, index, label)


def _model(client: Any, protocol: str) -> tuple[int, str, str, int, int, int, int, str]:
    if protocol == "grpc":
        metadata = client.get_model_metadata(MODEL, "", client_timeout=TIMEOUT)
        config = client.get_model_config(MODEL, "", client_timeout=TIMEOUT).config
        return _parse_model(*_as_dicts(metadata, config))
    return _parse_model(client.get_model_metadata(MODEL, ""), client.get_model_config(MODEL, ""))


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_client(
    triton_server: ServerProcess, triton_repo: Path, protocol: str, scaling: str
) -> None:
    """``image_client.py -m densenet_onnx -c 3 -s <scaling> -i <protocol> <image>``."""
    module: Any = httpclient if protocol == "http" else grpcclient
    if protocol == "http":
        client: Any = http_client(triton_server.http_url)
        kw: dict[str, float] = {}
    else:
        client, kw = grpc_client(triton_server.grpc_url), {"client_timeout": TIMEOUT}
    max_batch, input_name, output_name, c, h, w, layout, dtype = _model(client, protocol)
    assert (max_batch, c, h, w, layout) == (0, 3, 224, 224, mc.ModelInput.FORMAT_NCHW)
    image = preprocess(sample_image(), scaling)
    inputs = [module.InferInput(input_name, list(image.shape), dtype)]
    inputs[0].set_data_from_numpy(image)
    outputs = [module.InferRequestedOutput(output_name, class_count=3)]
    result = client.infer(MODEL, inputs, request_id="1", model_version="", outputs=outputs, **kw)
    response = result.get_response()
    assert (response["id"] if protocol == "http" else response.id) == "1", response
    _check_classes(result.as_numpy(output_name), _expected(triton_repo, scaling, 3))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_client_async(triton_server: ServerProcess, triton_repo: Path, protocol: str) -> None:
    """``image_client.py -a``: HTTP async_infer futures, gRPC async_infer with a callback."""
    image = preprocess(sample_image(), "NONE")
    if protocol == "http":
        client: Any = http_client(triton_server.http_url, concurrency=20)
        inputs = [httpclient.InferInput("data_0", list(image.shape), "FP32")]
        inputs[0].set_data_from_numpy(image)
        outputs = [httpclient.InferRequestedOutput("fc6_1", class_count=1)]
        result = client.async_infer(MODEL, inputs, request_id="1", outputs=outputs).get_result(
            timeout=TIMEOUT
        )
    else:
        client = grpc_client(triton_server.grpc_url)
        inputs = [grpcclient.InferInput("data_0", list(image.shape), "FP32")]
        inputs[0].set_data_from_numpy(image)
        outputs = [grpcclient.InferRequestedOutput("fc6_1", class_count=1)]
        done: queue.Queue[tuple[Any, Any]] = queue.Queue()
        callback = partial(lambda q, result, error: q.put((result, error)), done)
        client.async_infer(
            MODEL, inputs, callback, request_id="1", outputs=outputs, client_timeout=TIMEOUT
        )
        result, error = done.get(timeout=TIMEOUT)
        assert error is None, str(error)
    _check_classes(result.as_numpy("fc6_1"), _expected(triton_repo, "NONE", 1))


def test_image_client_streaming(triton_server: ServerProcess, triton_repo: Path) -> None:
    """``image_client.py --streaming -i grpc``: one request on the bidirectional stream."""
    image = preprocess(sample_image(), "NONE")
    client = grpc_client(triton_server.grpc_url)
    inputs = [grpcclient.InferInput("data_0", list(image.shape), "FP32")]
    inputs[0].set_data_from_numpy(image)
    outputs = [grpcclient.InferRequestedOutput("fc6_1", class_count=2)]
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(partial(lambda q, result, error: q.put((result, error)), done))
    try:
        client.async_stream_infer(MODEL, inputs, request_id="1", outputs=outputs)
        result, error = done.get(timeout=TIMEOUT)
    finally:
        client.stop_stream()
    assert error is None, str(error)
    assert result.get_response().id == "1"
    _check_classes(result.as_numpy("fc6_1"), _expected(triton_repo, "NONE", 2))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_client_batch_size(triton_server: ServerProcess, protocol: str) -> None:
    """``image_client.py -b 2``: densenet_onnx's config says it cannot batch, so the example
    stops with "This model doesn't support batching" before sending anything."""
    client: Any = (
        http_client(triton_server.http_url)
        if protocol == "http"
        else grpc_client(triton_server.grpc_url)
    )
    max_batch_size = _model(client, protocol)[0]
    assert max_batch_size == 0, "densenet_onnx must report max_batch_size 0, as Triton's does"


def _stub(server: ServerProcess) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_grpc_image_client(triton_server: ServerProcess, triton_repo: Path, scaling: str) -> None:
    """grpc_image_client.py: generated stubs, raw_input_contents, the classification parameter."""
    stub = _stub(triton_server)
    metadata = stub.ModelMetadata(
        service_pb2.ModelMetadataRequest(name=MODEL, version=""), timeout=TIMEOUT
    )
    config = stub.ModelConfig(
        service_pb2.ModelConfigRequest(name=MODEL, version=""), timeout=TIMEOUT
    ).config
    _, input_name, output_name, c, h, w, _, dtype = _parse_model(*_as_dicts(metadata, config))
    request = service_pb2.ModelInferRequest(model_name=MODEL, model_version="")
    output = service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=output_name)
    output.parameters["classification"].int64_param = 3
    request.outputs.append(output)
    request.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(
            name=input_name, datatype=dtype, shape=[c, h, w]
        )
    )
    request.raw_input_contents.append(preprocess(sample_image(), scaling).tobytes())
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    assert len(response.outputs) == 1, response.outputs
    assert len(response.raw_output_contents) == 1, response
    contents = np.reshape(
        deserialize_bytes_tensor(response.raw_output_contents[0]), response.outputs[0].shape
    )
    _check_classes(contents, _expected(triton_repo, scaling, 3))


def test_grpc_client(triton_server: ServerProcess) -> None:
    """grpc_client.py: every RPC through the stubs, then 602112 bytes of "a" as data_0."""
    stub = _stub(triton_server)
    assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=TIMEOUT).live
    assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=TIMEOUT).ready, "not ready"
    assert stub.ModelReady(
        service_pb2.ModelReadyRequest(name=MODEL, version=""), timeout=TIMEOUT
    ).ready
    assert (
        stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=TIMEOUT).name == "triton"
    )
    metadata = stub.ModelMetadata(
        service_pb2.ModelMetadataRequest(name=MODEL, version=""), timeout=TIMEOUT
    )
    assert metadata.name == MODEL, metadata
    config = stub.ModelConfig(
        service_pb2.ModelConfigRequest(name=MODEL, version=""), timeout=TIMEOUT
    )
    assert config.config.name == MODEL, config

    request = service_pb2.ModelInferRequest(model_name=MODEL, model_version="", id="my request id")
    request.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(
            name="data_0", datatype="FP32", shape=[3, 224, 224]
        )
    )
    request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="fc6_1"))
    request.raw_input_contents.append(bytes(602112 * "a", "utf-8"))
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    assert response.id == "my request id", response.id
    assert (response.model_name, response.outputs[0].name) == (MODEL, "fc6_1"), response
    assert list(response.outputs[0].shape) == [1000], response.outputs[0]
    assert len(response.raw_output_contents[0]) == 1000 * 4
