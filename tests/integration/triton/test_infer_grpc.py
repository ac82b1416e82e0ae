"""The gRPC inference examples of NVIDIA's Python client, mirrored against batchserve.

Each test makes the calls ``src/python/examples/<name>.py`` makes with ``tritonclient.grpc``
(or its generated stubs, for the ``grpc_explicit_*`` examples) and asserts what it checks.
"""

from __future__ import annotations

import asyncio
import queue
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import (
    INPUT0,
    ONES,
    TIMEOUT,
    assert_add_sub,
    grpc_client,
    identity_data,
    strings,
)


def _simple_request(module: object) -> tuple[list[object], list[object]]:
    """INPUT0 = 0..15, INPUT1 = ones, OUTPUT0 and OUTPUT1 requested, as the gRPC examples send."""
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(ONES)
    outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]  # type: ignore[attr-defined]
    return inputs, outputs


def _check(result: grpcclient.InferResult) -> None:
    assert_add_sub(INPUT0, ONES, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_simple_grpc_infer_client(triton_server: ServerProcess, compression: str | None) -> None:
    """Also the example's --grpc-compression-algorithm flag."""
    client = grpc_client(triton_server.grpc_url)
    inputs, outputs = _simple_request(grpcclient)
    results = client.infer(
        model_name="simple",
        inputs=inputs,
        outputs=outputs,
        client_timeout=TIMEOUT,
        headers={"test": "1"},
        compression_algorithm=compression,
    )
    statistics = client.get_inference_statistics(model_name="simple", client_timeout=TIMEOUT)
    assert len(statistics.model_stats) == 1, statistics
    _check(results)
    _check(
        client.infer(
            "simple",
            inputs,
            outputs=None,
            client_timeout=TIMEOUT,
            compression_algorithm=compression,
        )
    )


def test_simple_grpc_async_infer_client(triton_server: ServerProcess) -> None:
    client = grpc_client(triton_server.grpc_url)
    inputs, outputs = _simple_request(grpcclient)
    done: queue.Queue[object] = queue.Queue()

    def callback(user_data: queue.Queue[object], result: object, error: object) -> None:
        user_data.put(error or result)

    client.async_infer(
        "simple", inputs, partial(callback, done), outputs=outputs, client_timeout=TIMEOUT
    )
    result = done.get(timeout=TIMEOUT)
    assert not isinstance(result, InferenceServerException), str(result)
    _check(result)


def test_simple_grpc_aio_infer_client(triton_server: ServerProcess) -> None:
    async def main() -> None:
        client = aiogrpcclient.InferenceServerClient(url=triton_server.grpc_url)
        try:
            inputs, outputs = _simple_request(aiogrpcclient)
            results = await client.infer(
                "simple", inputs, outputs=outputs, client_timeout=TIMEOUT, headers={"test": "1"}
            )
            statistics = await client.get_inference_statistics(
                model_name="simple", client_timeout=TIMEOUT
            )
            assert len(statistics.model_stats) == 1, statistics
            _check(results)
            both = await asyncio.gather(
                client.infer("simple", inputs, outputs=None, client_timeout=TIMEOUT),
                client.infer("simple", inputs, outputs=None, client_timeout=TIMEOUT),
            )
            for result in both:
                _check(result)
        finally:
            await client.close()

    asyncio.run(main())


def test_simple_grpc_custom_args_client(triton_server: ServerProcess) -> None:
    channel_args = [
        ("grpc.max_send_message_length", 1024 * 1024),
        ("grpc.max_receive_message_length", 1024 * 1024),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.keepalive_timeout_ms", 20000),
        ("grpc.keepalive_permit_without_calls", False),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.dns_enable_srv_queries", 1),
    ]
    client = grpc_client(triton_server.grpc_url, channel_args=channel_args)
    inputs, outputs = _simple_request(grpcclient)
    _check(
        client.infer(
            "simple", inputs, outputs=outputs, headers={"test": "1"}, client_timeout=TIMEOUT
        )
    )


def test_simple_grpc_keepalive_client(triton_server: ServerProcess) -> None:
    """The example's defaults: keepalive off (INT_MAX), 20 s timeout, 2 pings without data."""
    options = grpcclient.KeepAliveOptions(
        keepalive_time_ms=2**31 - 1,
        keepalive_timeout_ms=20000,
        keepalive_permit_without_calls=False,
        http2_max_pings_without_data=2,
    )
    client = grpc_client(triton_server.grpc_url, keepalive_options=options)
    inputs, outputs = _simple_request(grpcclient)
    _check(
        client.infer(
            "simple", inputs, outputs=outputs, headers={"test": "1"}, client_timeout=TIMEOUT
        )
    )


def test_simple_grpc_string_infer_client(triton_server: ServerProcess) -> None:
    client = grpc_client(triton_server.grpc_url)
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    inputs[0].set_data_from_numpy(strings(INPUT0))
    inputs[1].set_data_from_numpy(strings(ONES))
    outputs = [grpcclient.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
    results = client.infer("simple_string", inputs, outputs=outputs, client_timeout=TIMEOUT)
    out0, out1 = results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1")
    for i in range(16):
        assert int(out0[0][i]) == INPUT0[0][i] + ONES[0][i], f"incorrect sum: {out0}"
        assert int(out1[0][i]) == INPUT0[0][i] - ONES[0][i], f"incorrect difference: {out1}"


@pytest.mark.parametrize("kind", ["null_chars", "bytes"])
def test_simple_grpc_string_infer_client_identity(triton_server: ServerProcess, kind: str) -> None:
    data = identity_data(kind)
    client = grpc_client(triton_server.grpc_url)
    inputs = [grpcclient.InferInput("INPUT0", data.shape, "BYTES")]
    inputs[0].set_data_from_numpy(data)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
    answer = client.infer(
        "simple_identity", inputs, outputs=outputs, client_timeout=TIMEOUT
    ).as_numpy("OUTPUT0")
    if data.dtype == np.object_:
        assert np.array_equal(data, answer), answer
    else:
        encoded = np.char.encode(answer.astype(str))
        assert np.array_equal(data, encoded), encoded


def _stub(server: ServerProcess) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def _explicit_request(model: str, datatype: str) -> service_pb2.ModelInferRequest:
    """Inputs in the typed ``contents`` fields, as the grpc_explicit_* examples fill them."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for index in (0, 1):
        tensor = service_pb2.ModelInferRequest.InferInputTensor(
            name=f"INPUT{index}", datatype=datatype, shape=[1, 16]
        )
        if datatype == "BYTES":
            values = [str(i).encode() if index == 0 else b"1" for i in range(16)]
            tensor.contents.bytes_contents.extend(values)
        else:
            tensor.contents.int_contents[:] = list(range(16)) if index == 0 else [1] * 16
        request.inputs.append(tensor)
    for index in (0, 1):
        request.outputs.append(
            service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=f"OUTPUT{index}")
        )
    return request


def _raw_outputs(response: service_pb2.ModelInferResponse, dtype: type) -> list[np.ndarray]:
    """The examples' decoding: raw_output_contents[i] resized to outputs[i].shape."""
    decoded = []
    for index, output in enumerate(response.outputs):
        raw = response.raw_output_contents[index]
        values = (
            utils.deserialize_bytes_tensor(raw)
            if dtype is object
            else np.frombuffer(raw, dtype=dtype)
        )
        decoded.append(np.resize(values, list(output.shape)))
    return decoded


def test_grpc_explicit_int_content_client(triton_server: ServerProcess) -> None:
    stub = _stub(triton_server)
    request = _explicit_request("simple", "INT32")
    results = _raw_outputs(stub.ModelInfer(request, timeout=TIMEOUT), np.int32)
    assert len(results) == 2, results
    assert_add_sub(INPUT0, ONES, results[0], results[1])


def test_grpc_explicit_int_content_client_raw_and_contents(triton_server: ServerProcess) -> None:
    """The example's last step: raw and typed contents in one request, refused as Triton does."""
    stub = _stub(triton_server)
    request = _explicit_request("simple", "INT32")
    request.raw_input_contents.extend([np.array(list(range(8))).tobytes()])
    request.inputs[0].contents.int_contents[:] = list(range(8, 16))
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=TIMEOUT)
    expected = (
        "contents field must not be specified when using raw_input_contents"
        " for 'INPUT0' for model 'simple'"
    )
    assert expected in str(error.value), error.value


def test_grpc_explicit_int8_content_client(triton_server: ServerProcess) -> None:
    stub = _stub(triton_server)
    request = _explicit_request("simple_int8", "INT8")
    results = _raw_outputs(stub.ModelInfer(request, timeout=TIMEOUT), np.int8)
    assert len(results) == 2, results
    assert_add_sub(INPUT0, ONES, results[0], results[1])


def test_grpc_explicit_int8_content_client_wrong_version(triton_server: ServerProcess) -> None:
    """The example's last step: a version string that is not a number, in Triton's words."""
    stub = _stub(triton_server)
    request = _explicit_request("simple_int8", "INT8")
    request.model_version = "wrong_specification"
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=TIMEOUT)
    expected = "failed to get model version from specified version string 'wrong_specification'"
    assert expected in str(error.value), error.value


def test_grpc_explicit_byte_content_client(triton_server: ServerProcess) -> None:
    stub = _stub(triton_server)
    results = _raw_outputs(
        stub.ModelInfer(_explicit_request("simple_string", "BYTES"), timeout=TIMEOUT), object
    )
    assert len(results) == 2, results
    for i in range(16):
        assert i + 1 == int(results[0][0][i]), results[0]
        assert i - 1 == int(results[1][0][i]), results[1]
