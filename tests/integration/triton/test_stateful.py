"""NVIDIA's sequence examples (``simple_{http,grpc}_sequence_*``, ``simple_grpc_aio_sequence_
stream_infer_client``) and decoupled example (``simple_grpc_custom_repeat``): the calls each
makes with tritonclient and the checks each makes, against simple_sequence and repeat_int32.
The examples' ``-d`` variants (``simple_dyna_sequence``) are not mirrored: that model is not
provided."""

from __future__ import annotations

import asyncio
import queue
import uuid
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _input(module: Any, value: int) -> Any:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _sync_flow(module: Any, url: str) -> None:
    """Two integer sequences and one with a UUID id, each value sent alone; the answers the
    examples check: the value + 1 on the first request (START), the value after."""
    client = module.InferenceServerClient(url)
    sequences = [(1000, [0, *VALUES]), (1001, [100, *(-v for v in VALUES)]),
                 (str(uuid.uuid4()), [20, *(-v for v in VALUES)])]  # fmt: skip
    for sequence_id, values in sequences:
        got = []
        for index, value in enumerate(values):
            result = client.infer(
                "simple_sequence", [_input(module, value)], sequence_id=sequence_id,
                sequence_start=index == 0, sequence_end=index == len(values) - 1,
            )  # fmt: skip
            got.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert got == [values[0] + 1, *values[1:]]


def test_simple_http_sequence_sync_infer_client(triton_server: ServerProcess) -> None:
    _sync_flow(httpclient, triton_server.http_url)


def test_simple_grpc_sequence_sync_infer_client(triton_server: ServerProcess) -> None:
    _sync_flow(grpcclient, triton_server.grpc_url)


def _expected() -> dict[int, list[int]]:
    return {1000: [1, *VALUES], 1001: [101, *(-v for v in VALUES)]}


def test_simple_grpc_sequence_stream_infer_client(triton_server: ServerProcess) -> None:
    """Two sequences interleaved on one stream; answers told apart by their request ids
    (``<sequence>_<step>``), as the example does."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    sent = {1000: [0, *VALUES], 1001: [100, *(-v for v in VALUES)]}
    for step in range(len(VALUES) + 1):
        for sequence_id, values in sent.items():
            client.async_stream_infer(
                "simple_sequence", [_input(grpcclient, values[step])],
                request_id=f"{sequence_id}_{step}", sequence_id=sequence_id,
                sequence_start=step == 0, sequence_end=step == len(values) - 1,
            )  # fmt: skip
    got: dict[int, dict[int, int]] = {1000: {}, 1001: {}}
    for _ in range(2 * (len(VALUES) + 1)):
        answer = answers.get(timeout=30)
        assert isinstance(answer, grpcclient.InferResult), answer
        sequence_id, step = map(int, answer.get_response().id.split("_"))
        got[sequence_id][step] = int(answer.as_numpy("OUTPUT")[0][0])
    client.stop_stream()
    assert {k: [v[i] for i in sorted(v)] for k, v in got.items()} == _expected()


def test_simple_grpc_aio_sequence_stream_infer_client(triton_server: ServerProcess) -> None:
    async def flow() -> dict[int, list[int]]:
        sent = {1000: [0, *VALUES], 1001: [100, *(-v for v in VALUES)]}

        async def requests() -> Any:
            for step in range(len(VALUES) + 1):
                for sequence_id, values in sent.items():
                    yield {
                        "model_name": "simple_sequence",
                        "inputs": [_input(aiogrpcclient, values[step])],
                        "request_id": f"{sequence_id}_{step}", "sequence_id": sequence_id,
                        "sequence_start": step == 0, "sequence_end": step == len(values) - 1,
                    }  # fmt: skip

        got: dict[int, dict[int, int]] = {1000: {}, 1001: {}}
        async with aiogrpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                sequence_id, step = map(int, result.get_response().id.split("_"))
                got[sequence_id][step] = int(result.as_numpy("OUTPUT")[0][0])
                if sum(map(len, got.values())) == 2 * (len(VALUES) + 1):
                    break
        return {k: [v[i] for i in sorted(v)] for k, v in got.items()}

    assert asyncio.run(flow()) == _expected()


def test_simple_grpc_custom_repeat(triton_server: ServerProcess) -> None:
    """IN 100..109 repeated back one response each, in order; the example waits 1000 ms
    between responses, 50 ms here."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = np.arange(100, 110, dtype=np.int32)
    inputs = [grpcclient.InferInput("IN", [10], "INT32"),
              grpcclient.InferInput("DELAY", [10], "UINT32"),
              grpcclient.InferInput("WAIT", [1], "UINT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.full(10, 50, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([1000], dtype=np.uint32))
    client.async_stream_infer(
        "repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")]
    )
    for expected in values:
        result, error = answers.get(timeout=30)
        assert error is None, error
        out = result.as_numpy("OUT")
        assert len(out) == 1
        assert out[0] == expected
    client.stop_stream()
    with pytest.raises(queue.Empty):
        answers.get(timeout=0.2)
