"""NVIDIA's sequence examples (``simple_{http,grpc}_sequence_*``, ``simple_grpc_aio_sequence_
stream_infer_client``), plain and with ``-d`` (``--dyna``), and decoupled example
(``simple_grpc_custom_repeat``): the calls each makes with tritonclient and the checks each
makes, against simple_sequence, simple_dyna_sequence, simple_string_dyna_sequence and
repeat_int32."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess

VALUES = [11, 7, 5, 3, 2, 0, 1]
SequenceId = int | str
Sent = list[tuple[SequenceId, str, list[int]]]
"""(sequence id, model, values) of each sequence an example sends."""


def _input(module: Any, value: int) -> Any:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _sent(dyna: bool) -> Sent:
    """Two integer sequences and one with a string id (a UUID, or with ``-d`` an integer as
    text, which the dyna backend needs), as every example sends them."""
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    negated = [-v for v in VALUES]
    return [
        (1000, int_model, [0, *VALUES]),
        (1001, int_model, [100, *negated]),
        ("1002" if dyna else str(uuid.uuid4()), string_model, [20, *negated]),
    ]


def _check(dyna: bool, sent: Sent, got: list[list[int]]) -> None:
    """The examples' checks: the value (+ 1 on START for simple_sequence); with ``-d`` the
    string sequence accumulates, and the END request adds the correlation id."""
    (id0, _, _), (id1, _, _), (string_id, _, _) = sent
    assert all(len(results) == len(VALUES) + 1 for results in got), got
    for i in range(len(VALUES) + 1):
        int0 = 1 if i == 0 else VALUES[i - 1]
        int1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            string0 = 20 if dyna else 21
        else:
            string0 = -VALUES[i - 1] + (got[2][i - 1] if dyna else 0)
        if dyna and i != 0 and VALUES[i - 1] == 1:
            int0, int1 = int0 + int(id0), int1 + int(id1)
            string0 += int(string_id)
        assert [got[0][i], got[1][i], got[2][i]] == [int0, int1, string0], (i, got)


def _sync_flow(module: Any, url: str, dyna: bool) -> None:
    """Each sequence sent whole, one request at a time."""
    client = module.InferenceServerClient(url)
    sent = _sent(dyna)
    got = []
    for sequence_id, model, values in sent:
        results = []
        for index, value in enumerate(values):
            result = client.infer(
                model, [_input(module, value)], sequence_id=sequence_id,
                sequence_start=index == 0, sequence_end=index == len(values) - 1,
            )  # fmt: skip
            results.append(int(result.as_numpy("OUTPUT")[0][0]))
        got.append(results)
    _check(dyna, sent, got)


@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_simple_http_sequence_sync_infer_client(triton_server: ServerProcess, dyna: bool) -> None:
    _sync_flow(httpclient, triton_server.http_url, dyna)


@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_simple_grpc_sequence_sync_infer_client(triton_server: ServerProcess, dyna: bool) -> None:
    _sync_flow(grpcclient, triton_server.grpc_url, dyna)


def _stream_requests(module: Any, sent: Sent) -> list[dict[str, Any]]:
    """The three sequences interleaved, step by step; request ids ``<sequence>_<step>``."""
    requests = []
    for step in range(len(VALUES) + 1):
        for sequence_id, model, values in sent:
            requests.append({
                "model_name": model, "inputs": [_input(module, values[step])],
                "request_id": f"{sequence_id}_{step}", "sequence_id": sequence_id,
                "sequence_start": step == 0, "sequence_end": step == len(values) - 1,
            })  # fmt: skip
    return requests


def _collector(sent: Sent) -> tuple[dict[str, dict[int, int]], Callable[[Any], bool]]:
    """Answers told apart by their request ids, as the examples do; ``add`` says when all
    have come."""
    got: dict[str, dict[int, int]] = {str(sequence_id): {} for sequence_id, _, _ in sent}

    def add(result: Any) -> bool:
        sequence_id, step = result.get_response().id.rsplit("_", 1)
        got[sequence_id][int(step)] = int(result.as_numpy("OUTPUT")[0][0])
        return sum(map(len, got.values())) == len(sent) * (len(VALUES) + 1)

    return got, add


def _ordered(got: dict[str, dict[int, int]]) -> list[list[int]]:
    return [[steps[i] for i in sorted(steps)] for steps in got.values()]


@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_simple_grpc_sequence_stream_infer_client(triton_server: ServerProcess, dyna: bool) -> None:
    sent = _sent(dyna)
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    for request in _stream_requests(grpcclient, sent):
        client.async_stream_infer(**request)
    got, add = _collector(sent)
    done = False
    while not done:
        answer = answers.get(timeout=30)
        assert isinstance(answer, grpcclient.InferResult), answer
        done = add(answer)
    client.stop_stream()
    _check(dyna, sent, _ordered(got))


@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_simple_grpc_aio_sequence_stream_infer_client(
    triton_server: ServerProcess, dyna: bool
) -> None:
    sent = _sent(dyna)

    async def flow() -> dict[str, dict[int, int]]:
        async def requests() -> Any:
            for request in _stream_requests(aiogrpcclient, sent):
                yield request

        got, add = _collector(sent)
        async with aiogrpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                if add(result):
                    break
        return got

    _check(dyna, sent, _ordered(asyncio.run(flow())))


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
