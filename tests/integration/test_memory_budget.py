"""A model whose max_batch_size is more than its memory budget allows: the server derives a
smaller cap at load, batches stay under it under load, and no request fails."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

MODEL = "char_lstm"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget_repo")
    shutil.copytree(MODEL_REPO / MODEL, root / MODEL)
    return root


def _stats(server: ServerProcess) -> dict[str, object]:
    url = f"http://{server.http_url}/v2/models/{MODEL}/stats"
    return dict(httpx.get(url).json()["model_stats"][0])


@pytest.fixture(scope="module")
def budgeted(repo: Path) -> Iterator[ServerProcess]:
    """Measure the model once, then restart it with a budget worth about 16 samples."""
    probe = start_server(repo)
    measured = _stats(probe)["batchserve"]["instances"][0]  # type: ignore[index]
    assert probe.stop() == 0
    budget = measured["fixed_bytes"] + 16 * measured["per_sample_bytes"]
    config = repo / MODEL / "config.pbtxt"
    text = config.read_text().replace(
        "batchserve {", f"batchserve {{\n  memory_budget_bytes: {budget}"
    )
    config.write_text(text)
    server = start_server(repo)
    yield server
    assert server.stop() == 0


def test_batches_stay_under_the_derived_cap_and_nothing_fails(budgeted: ServerProcess) -> None:
    cap = int(_stats(budgeted)["batchserve"]["batch_cap"])  # type: ignore[index]
    assert 1 <= cap < 64
    rng = np.random.default_rng(0)
    lengths = [int(rng.integers(1, 100)) for _ in range(256)]

    def infer(length: int) -> httpclient.InferResult:
        """One request on a connection of its own, closed on this thread (a client left to the
        garbage collector is finalised on any thread, where its gevent pool has no hub): 32
        threads keep 32 in flight."""
        tokens = np.random.default_rng(length).integers(3, 98, size=(1, length)).astype(np.int64)
        inputs = [httpclient.InferInput("tokens", [1, length], "INT64"),
                  httpclient.InferInput("lengths", [1, 1], "INT64")]  # fmt: skip
        inputs[0].set_data_from_numpy(tokens)
        inputs[1].set_data_from_numpy(np.array([[length]], dtype=np.int64))
        with httpclient.InferenceServerClient(budgeted.http_url) as client:
            return client.infer(MODEL, inputs)

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(infer, lengths))
    assert all(r.as_numpy("next_char_logits").shape == (1, 98) for r in results)
    stats = _stats(budgeted)
    inference = stats["inference_stats"]  # type: ignore[index]
    assert inference["fail"]["count"] == 0  # type: ignore[index]
    assert inference["success"]["count"] == 256  # type: ignore[index]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]  # type: ignore[union-attr]
    assert max(sizes) <= cap
    assert max(sizes) > 1, "concurrent requests should have been batched"


def test_a_batch_over_the_derived_cap_is_400_and_one_at_it_is_served(
    budgeted: ServerProcess,
) -> None:
    """The budget lowered the cap below max_batch_size: a request that can never fit is the
    client's to split, said at once rather than failing on the device."""
    cap = int(_stats(budgeted)["batchserve"]["batch_cap"])  # type: ignore[index]
    assert 1 <= cap < 64

    def body(batch: int) -> dict[str, object]:
        return {"inputs": [
            {"name": "tokens", "datatype": "INT64", "shape": [batch, 5], "data": [3] * (batch * 5)},
            {"name": "lengths", "datatype": "INT64", "shape": [batch, 1], "data": [5] * batch},
        ]}  # fmt: skip

    url = f"http://{budgeted.http_url}/v2/models/{MODEL}/infer"
    over = httpx.post(url, json=body(cap + 1), timeout=30)
    assert over.status_code == 400
    assert over.json()["error"].startswith(f"batch of {cap + 1} samples exceeds the batch cap")
    assert httpx.post(url, json=body(cap), timeout=30).status_code == 200
