"""Triton's restricted APIs and protocols, as its QA suite starts the server (``L0_http``'s
``--http-restricted-api=model-repository:admin-key=admin-value`` and
``--http-restricted-api=inference,metadata:infer-key=infer-value``) and checks it with
tritonclient (``http_restricted_api_test.py``); the same groups over gRPC; by one process and
by two workers, which answer inference themselves; and the command lines Triton refuses to
start with."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

GROUPS = ("model-repository:admin-key=admin-value", "inference,metadata:infer-key=infer-value")
GRPC_INFER_KEY = {"triton-grpc-protocol-infer-key": "infer-value"}


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    args = ["--workers", request.param]
    for group in GROUPS:
        args += ["--http-restricted-api", group, "--grpc-restricted-protocol", group]
    process = start_server(MODEL_REPO, args)
    yield process
    assert process.stop() == 0


def _image_input(module: Any) -> Any:
    tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
    return tensor


PROTOCOLS = {
    "http": (httpclient, "This API is restricted, expecting header '{}'", "", "403"),
    "grpc": (
        grpcclient,
        "This protocol is restricted, expecting header 'triton-grpc-protocol-{}'",
        "triton-grpc-protocol-",
        "StatusCode.PERMISSION_DENIED",
    ),
}
"""Each protocol's client module, refusal, header prefix and refusal status."""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_apis_answer_only_with_their_groups_header(server: ServerProcess, protocol: str) -> None:
    module, restricted, prefix, status = PROTOCOLS[protocol]
    client = module.InferenceServerClient(
        server.http_url if protocol == "http" else server.grpc_url
    )
    infer_key = {prefix + "infer-key": "infer-value"}
    # other APIs are not restricted, with or without a header
    client.get_inference_statistics("digits_cnn")
    client.get_inference_statistics("digits_cnn", headers=infer_key)
    assert client.is_server_ready()
    # model repository: the admin header, and then the call's own answer
    with pytest.raises(InferenceServerException, match=restricted.format("admin-key")) as refused:
        client.unload_model("digits_cnn", headers=infer_key)
    assert refused.value.status() == status
    with pytest.raises(InferenceServerException, match="explicit model load / unload is not"):
        client.unload_model("digits_cnn", headers={prefix + "admin-key": "admin-value"})
    # metadata and inference: the inference header, with its value
    with pytest.raises(InferenceServerException, match=restricted.format("infer-key")):
        client.get_server_metadata()
    with pytest.raises(InferenceServerException, match=restricted.format("infer-key")):
        client.get_model_metadata("digits_cnn", headers={prefix + "infer-key": "wrong"})
    assert client.get_server_metadata(headers=infer_key) is not None
    with pytest.raises(InferenceServerException, match=restricted.format("infer-key")):
        client.infer("digits_cnn", [_image_input(module)], headers={"test": "1"})
    answered = client.infer("digits_cnn", [_image_input(module)], headers=infer_key)
    assert answered.as_numpy("logits").shape == (1, 10)
    client.close()


def test_the_standard_grpc_health_service_is_not_restricted(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_stream_answers_only_with_the_inference_metadata(server: ServerProcess) -> None:
    for headers, refused in ((None, True), (GRPC_INFER_KEY, False)):
        result, error = _one_stream_answer(server, headers)
        if refused:
            assert "This protocol is restricted, expecting header" in str(error)
        else:
            assert error is None
            assert result.as_numpy("logits").shape == (1, 10)


def _one_stream_answer(server: ServerProcess, headers: dict[str, str] | None) -> tuple[Any, Any]:
    """The first answer of a ModelStreamInfer stream opened with ``headers``."""
    answers: list[tuple[Any, Any]] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.append((result, error)),
                        headers=headers)  # fmt: skip
    # a refused stream may end before the request is sent: tritonclient then raises here,
    # and its callback has the refusal
    with contextlib.suppress(InferenceServerException):
        client.async_stream_infer("digits_cnn", [_image_input(grpcclient)])
    client.stop_stream()
    client.close()
    return answers[0]


@pytest.mark.parametrize(
    ("groups", "refusal"),
    [
        (("model-repository,health:k1=v1", "metadata,health:k2=v2"),
         "restricted api 'health' can not be specified in multiple config groups"),
        (("model-reposit,health:k1=v1", "metadata:k2=v2"),
         "unknown restricted api 'model-reposit'"),
    ],
)  # fmt: skip
def test_a_command_line_triton_refuses_does_not_start(
    groups: tuple[str, ...], refusal: str
) -> None:
    """L0_http's two servers that must not start, and the reason in the log."""
    command = [
        sys.executable,
        "-m",
        "batchserve.cli",
        "serve",
        "--model-repository",
        str(MODEL_REPO),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
    ]
    for group in groups:
        command += ["--http-restricted-api", group]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert refusal in done.stderr
    assert "Traceback" not in done.stderr
