"""Mixed-length char_lstm requests, batched together by the server, answer exactly as the
model does for each request alone."""

from __future__ import annotations

import time

import httpx
import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from tests.integration.server import MODEL_REPO, ServerProcess

MODEL = "char_lstm"


def _request(length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(3, 98, size=(1, length)).astype(np.int64)
    return tokens, np.array([[length]], dtype=np.int64)


def test_mixed_lengths_batch_like_one_by_one(server: ServerProcess) -> None:
    session = ort.InferenceSession(str(MODEL_REPO / MODEL / "1" / "model.onnx"))
    rng = np.random.default_rng(42)
    requests = [_request(int(n), rng) for n in rng.integers(1, 120, size=48)]
    before = httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/stats").json()
    executions_before = before["model_stats"][0]["execution_count"]
    answers: list[object] = [None] * len(requests)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for index, (tokens, lengths) in enumerate(requests):
        inputs = [grpcclient.InferInput("tokens", list(tokens.shape), "INT64"),
                  grpcclient.InferInput("lengths", [1, 1], "INT64")]  # fmt: skip
        inputs[0].set_data_from_numpy(tokens)
        inputs[1].set_data_from_numpy(lengths)

        def done(result: object, error: object, index: int = index) -> None:
            answers[index] = error if error is not None else result

        client.async_infer(MODEL, inputs, callback=done)
    deadline = 60.0
    started = time.monotonic()
    while any(a is None for a in answers) and time.monotonic() - started < deadline:
        time.sleep(0.01)
    client.close()
    for (tokens, lengths), answer in zip(requests, answers, strict=True):
        assert isinstance(answer, grpcclient.InferResult), answer
        (alone,) = session.run(None, {"tokens": tokens, "lengths": lengths})
        np.testing.assert_allclose(answer.as_numpy("next_char_logits"), alone, rtol=1e-4, atol=1e-5)
    after = httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/stats").json()["model_stats"][0]
    executions = after["execution_count"] - executions_before
    assert executions < len(requests), (
        "concurrent requests of different lengths should share batches"
    )
