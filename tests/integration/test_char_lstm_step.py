"""char_lstm_step, shipped: texts fed one character a request, in sequences interleaved and
concurrent over HTTP, gRPC and a gRPC stream, give after every character the logits char_lstm
gives for that prefix (within 1e-4). By one process and by two workers."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.zoo import char_lstm

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

STEP = "char_lstm_step"
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    x: int = 0\n",
    "for line in open(path):\n    print(line)",
    'if __name__ == "__main__":\n    main()\n',
]


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def step_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    server = start_server(MODEL_REPO, ["--workers", request.param])
    yield server
    assert server.stop() == 0


def _prefix_logits(text: str) -> np.ndarray:
    """char_lstm (the shipped ONNX file) on every prefix of ``text``, one batch."""
    session = ort.InferenceSession(str(MODEL_REPO / "char_lstm" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    ids = char_lstm.encode(text)
    tokens = np.zeros((len(ids), len(ids)), np.int64)
    for row in range(len(ids)):
        tokens[row, : row + 1] = ids[: row + 1]
    lengths = np.arange(1, len(ids) + 1, dtype=np.int64)[:, None]
    return np.asarray(session.run(None, {"tokens": tokens, "lengths": lengths})[0])


def _token(module: object, token: int) -> object:
    tensor = module.InferInput("token", [1, 1], "INT64")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([[token]], np.int64))
    return tensor


def _sync(server: ServerProcess, module: object, sequence_id: int, text: str) -> np.ndarray:
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    try:
        ids = char_lstm.encode(text)
        rows = []
        for index, token in enumerate(ids):
            last = index == len(ids) - 1
            result = client.infer(STEP, [_token(module, int(token))], sequence_id=sequence_id,
                                  sequence_start=index == 0, sequence_end=last)  # fmt: skip
            rows.append(result.as_numpy("next_char_logits")[0])
        return np.stack(rows)
    finally:
        # closed on this thread: an HTTP client left to the garbage collector is finalised on
        # whichever thread collects it, where its gevent pool has no hub to join on
        client.close()


def _streamed(server: ServerProcess, sequence_id: int, text: str) -> np.ndarray:
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    ids = char_lstm.encode(text)
    for index, token in enumerate(ids):
        client.async_stream_infer(STEP, [_token(grpcclient, int(token))], request_id=str(index),
                                  sequence_id=sequence_id, sequence_start=index == 0,
                                  sequence_end=index == len(ids) - 1)  # fmt: skip
    rows: dict[int, np.ndarray] = {}
    for _ in ids:
        answer = answers.get(timeout=60)
        assert isinstance(answer, grpcclient.InferResult), answer
        rows[int(answer.get_response().id)] = answer.as_numpy("next_char_logits")[0]
    client.stop_stream()
    client.close()
    return np.stack([rows[i] for i in range(len(ids))])


def test_every_step_matches_char_lstm_on_the_prefix(step_server: ServerProcess) -> None:
    runs = [
        lambda: _sync(step_server, httpclient, 501, TEXTS[0]),
        lambda: _sync(step_server, grpcclient, 502, TEXTS[1]),
        lambda: _streamed(step_server, 503, TEXTS[2]),
        lambda: _sync(step_server, httpclient, 504, TEXTS[3]),
    ]
    with ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda run: run(), runs))
    for text, got in zip(TEXTS, results, strict=True):
        np.testing.assert_allclose(got, _prefix_logits(text), atol=1e-4)
