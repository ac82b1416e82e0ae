"""A poisoned request inside a batch, from outside: only it fails, and its neighbours are
answered exactly as the model answers them alone; by one process, and by two workers, which
send the requests they decode together as one group."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, ServerProcess

MODEL = "char_lstm"
LENGTH = 16
POISON = 10**6  # far outside the embedding's vocabulary: the runtime's Gather fails


def _infer(client: httpclient.InferenceServerClient, tokens: np.ndarray) -> np.ndarray:
    inputs = [httpclient.InferInput("tokens", [1, LENGTH], "INT64"),
              httpclient.InferInput("lengths", [1, 1], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(np.array([[LENGTH]], dtype=np.int64))
    result = client.infer(MODEL, inputs).as_numpy("next_char_logits")
    assert result is not None
    return result


def test_a_poisoned_request_in_a_batch_fails_alone(server_either_way: ServerProcess) -> None:
    server = server_either_way
    session = ort.InferenceSession(str(MODEL_REPO / MODEL / "1" / "model.onnx"))
    rng = np.random.default_rng(7)
    requests = [rng.integers(3, 98, size=(1, LENGTH)).astype(np.int64) for _ in range(8)]
    requests[3] = requests[3].copy()
    requests[3][0, 5] = POISON
    stats_url = f"http://{server.http_url}/v2/models/{MODEL}/stats"
    before = httpx.get(stats_url).json()["model_stats"][0]
    barrier = threading.Barrier(len(requests))

    def send(tokens: np.ndarray) -> np.ndarray | Exception:
        # closed by the thread that made it: a client left to the garbage collector after
        # its thread ended closes itself without that thread's gevent hub, and fails
        with httpclient.InferenceServerClient(server.http_url) as client:
            barrier.wait()  # all eight at once, so that they share batches
            try:
                return _infer(client, tokens)
            except InferenceServerException as exc:
                return exc

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        outcomes = list(pool.map(send, requests))
    after = httpx.get(stats_url).json()["model_stats"][0]
    failed = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, Exception)]
    assert failed == [3]
    error = outcomes[3]
    assert isinstance(error, InferenceServerException)
    assert error.status() == "400", error  # the request's own fault, named by the runtime
    for i, outcome in enumerate(outcomes):
        if i == 3:
            continue
        expected = session.run(
            ["next_char_logits"],
            {"tokens": requests[i], "lengths": np.array([[LENGTH]], dtype=np.int64)},
        )[0]
        np.testing.assert_allclose(outcome, expected, rtol=1e-4, atol=1e-5)
    fails = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert fails == 1
    succeeded = after["inference_stats"]["success"]["count"]
    assert succeeded - before["inference_stats"]["success"]["count"] == 7  # each counted once
    # a good request afterwards is still answered
    with httpclient.InferenceServerClient(server.http_url) as client:
        np.testing.assert_allclose(_infer(client, requests[0]), outcomes[0], rtol=1e-5)
    batched = after["inference_count"] - before["inference_count"]
    runs = after["execution_count"] - before["execution_count"]
    if runs >= batched:
        pytest.skip("the eight requests did not share a batch this time")
