"""The HTTP inference examples of NVIDIA's Python client, mirrored against batchserve.

Each test makes the calls ``src/python/examples/<name>.py`` makes with ``tritonclient.http``
and asserts what that example checks.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import (
    INPUT0,
    MINUS_ONES,
    ONES,
    TIMEOUT,
    assert_add_sub,
    http_client,
    identity_data,
    strings,
)

QUERY = {"test_1": 1, "test_2": 2}


def _simple_inputs(module: object, input0: np.ndarray, input1: np.ndarray) -> list[object]:
    """INPUT0 as JSON, INPUT1 as binary: simple_http_infer_client.py mixes the two."""
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),  # type: ignore[attr-defined]
        module.InferInput("INPUT1", [1, 16], "INT32"),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(input0, binary_data=False)
    inputs[1].set_data_from_numpy(input1, binary_data=True)
    return inputs


def _simple_outputs(module: object) -> list[object]:
    return [
        module.InferRequestedOutput("OUTPUT0", binary_data=True),  # type: ignore[attr-defined]
        module.InferRequestedOutput("OUTPUT1", binary_data=False),  # type: ignore[attr-defined]
    ]


def test_simple_http_infer_client(triton_server: ServerProcess) -> None:
    client = http_client(triton_server.http_url)
    inputs = _simple_inputs(httpclient, INPUT0, MINUS_ONES)
    results = client.infer(
        "simple", inputs, outputs=_simple_outputs(httpclient), query_params=QUERY
    )
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics["model_stats"]) == 1, statistics
    assert_add_sub(INPUT0, MINUS_ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))

    results = client.infer("simple", inputs, outputs=None, query_params=QUERY)
    assert_add_sub(INPUT0, MINUS_ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))


def test_simple_http_infer_client_unknown_model(triton_server: ServerProcess) -> None:
    """The example's last step: a wrong model name is refused in Triton's words."""
    client = http_client(triton_server.http_url)
    inputs = _simple_inputs(httpclient, INPUT0, MINUS_ONES)
    with pytest.raises(InferenceServerException) as error:
        client.infer("wrong_model_name", inputs, outputs=_simple_outputs(httpclient))
    assert error.value.message().startswith("Request for unknown model"), error.value.message()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_simple_http_infer_client_compression(triton_server: ServerProcess, algorithm: str) -> None:
    """The example's --request/--response-compression-algorithm flags."""
    client = http_client(triton_server.http_url)
    results = client.infer(
        "simple",
        _simple_inputs(httpclient, INPUT0, MINUS_ONES),
        outputs=_simple_outputs(httpclient),
        query_params=QUERY,
        headers={"test": "1"},
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    assert_add_sub(INPUT0, MINUS_ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))


def test_simple_http_async_infer_client(triton_server: ServerProcess) -> None:
    request_count = 2
    client = http_client(triton_server.http_url, concurrency=request_count)
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=True)
    inputs[1].set_data_from_numpy(ONES, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=True) for i in (0, 1)]
    pending = [client.async_infer("simple", inputs, outputs=outputs) for _ in range(request_count)]
    for request in pending:
        result = request.get_result(timeout=TIMEOUT)
        assert_add_sub(INPUT0, ONES, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))


def test_simple_http_aio_infer_client(triton_server: ServerProcess) -> None:
    async def infer(
        client: aiohttpclient.InferenceServerClient, name: str, outputs: bool
    ) -> object:
        inputs = _simple_inputs(aiohttpclient, INPUT0, MINUS_ONES)
        wanted = _simple_outputs(aiohttpclient) if outputs else None
        call = client.infer(name, inputs, outputs=wanted, query_params=QUERY)
        return await asyncio.wait_for(call, TIMEOUT)

    async def main() -> None:
        client = aiohttpclient.InferenceServerClient(triton_server.http_url, conn_timeout=TIMEOUT)
        try:
            results = await infer(client, "simple", True)
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics["model_stats"]) == 1, statistics
            for result in [results, await infer(client, "simple", False)]:
                out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")  # type: ignore[attr-defined]
                assert_add_sub(INPUT0, MINUS_ONES, out0, out1)
            both = await asyncio.gather(
                infer(client, "simple", True), infer(client, "simple", False)
            )
            for result in both:
                out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")  # type: ignore[attr-defined]
                assert_add_sub(INPUT0, MINUS_ONES, out0, out1)
        finally:
            await client.close()

    asyncio.run(main())


def test_simple_http_aio_infer_client_unknown_model(triton_server: ServerProcess) -> None:
    """The aio example's wrong-model step: refused in Triton's words."""

    async def main() -> str:
        client = aiohttpclient.InferenceServerClient(triton_server.http_url, conn_timeout=TIMEOUT)
        try:
            inputs = _simple_inputs(aiohttpclient, INPUT0, MINUS_ONES)
            call = client.infer("wrong_model_name", inputs, outputs=_simple_outputs(aiohttpclient))
            with pytest.raises(InferenceServerException) as error:
                await asyncio.wait_for(call, TIMEOUT)
            return str(error.value.message())
        finally:
            await client.close()

    message = asyncio.run(main())
    assert message.startswith("Request for unknown model"), message


def test_simple_http_string_infer_client(triton_server: ServerProcess) -> None:
    client = http_client(triton_server.http_url)
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    inputs[0].set_data_from_numpy(strings(INPUT0), binary_data=True)
    inputs[1].set_data_from_numpy(strings(ONES), binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    results = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
    out0, out1 = results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1")
    for i in range(16):
        assert int(out0[0][i]) == INPUT0[0][i] + ONES[0][i], f"incorrect sum: {out0}"
        assert int(out1[0][i]) == INPUT0[0][i] - ONES[0][i], f"incorrect difference: {out1}"


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("kind", ["null_chars", "bytes"])
def test_simple_http_string_infer_client_identity(
    triton_server: ServerProcess, kind: str, binary_data: bool
) -> None:
    """identity_inference(): strings with NUL inside, and raw bytes, each as binary and JSON."""
    data = identity_data(kind)
    client = http_client(triton_server.http_url)
    inputs = [httpclient.InferInput("INPUT0", data.shape, "BYTES")]
    inputs[0].set_data_from_numpy(data, binary_data=binary_data)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_data)]
    answer = client.infer("simple_identity", inputs, outputs=outputs).as_numpy("OUTPUT0")
    if data.dtype == np.object_:
        if not binary_data:  # JSON answers str; the example encodes each back to bytes
            answer = np.array(
                [bytes(str(x), encoding="utf-8") for x in answer.flatten()], dtype=np.object_
            )
            answer = answer.reshape([1, 16])
        assert np.array_equal(data, answer), answer
    else:
        encoded = np.char.encode(answer.astype(str))
        assert np.array_equal(data, encoded), encoded
