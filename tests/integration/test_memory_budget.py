"""A model whose max_batch_size is more than its memory budget allows: the server derives a
smaller cap at load, batches stay under it under load, and no request fails."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

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


def _batch_counts(server: ServerProcess) -> dict[int, int]:
    """Batches run so far, by their rows."""
    rows = _stats(server)["batch_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in rows}  # type: ignore[attr-defined]


def _sequences(rows: int, length: int) -> dict[str, object]:
    return {"inputs": [
        {"name": "tokens", "datatype": "INT64", "shape": [rows, length],
         "data": [3] * (rows * length)},
        {"name": "lengths", "datatype": "INT64", "shape": [rows, 1], "data": [length] * rows},
    ]}  # fmt: skip


def test_long_sequences_batch_in_fewer_rows_within_the_steps_reserved(
    budgeted: ServerProcess,
) -> None:
    """Memory grows with rows times padded length: requests a quarter of the steps long batch
    at most four to a batch, though the row cap is four times that."""
    batchserve = _stats(budgeted)["batchserve"]
    steps, cap = int(batchserve["batch_steps"]), int(batchserve["batch_cap"])  # type: ignore[index]
    instance = batchserve["instances"][0]  # type: ignore[index]
    assert steps == instance["batch_steps"]  # type: ignore[index]
    assert steps >= 4 * 128
    assert cap >= 8
    before = _batch_counts(budgeted)
    url = f"http://{budgeted.http_url}/v2/models/{MODEL}/infer"
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(max_workers=24) as pool:
        codes = list(pool.map(
            lambda _: client.post(url, json=_sequences(1, steps // 4)).status_code, range(48)
        ))  # fmt: skip
    assert codes == [200] * 48
    ran = [size for size, count in _batch_counts(budgeted).items() if count > before.get(size, 0)]
    assert max(ran) <= 4
    assert max(ran) > 1, "concurrent requests should have been batched"


def test_a_request_over_the_steps_reserved_is_400_naming_the_tensor(
    budgeted: ServerProcess,
) -> None:
    """The model's own memory_budget_bytes bounds it: nothing is lent beyond it."""
    steps = int(_stats(budgeted)["batchserve"]["batch_steps"])  # type: ignore[index]
    url = f"http://{budgeted.http_url}/v2/models/{MODEL}/infer"
    over = httpx.post(url, json=_sequences(1, steps + 1), timeout=30)
    assert over.status_code == 400
    assert over.json()["error"].startswith(
        f"input 'tokens': 1 sequence(s) of length {steps + 1} are {steps + 1} steps, more than "
        f"a batch of model '{MODEL}' may hold ({steps} steps"
    )
    assert httpx.post(url, json=_sequences(2, steps // 2), timeout=30).status_code == 200


@pytest.fixture(scope="module")
def long_batches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The model with ``max_batch_steps`` raised past what the probe's rows hold."""
    root = tmp_path_factory.mktemp("long_repo")
    shutil.copytree(MODEL_REPO / MODEL, root / MODEL)
    config = root / MODEL / "config.pbtxt"
    config.write_text(
        config.read_text().replace("batchserve {", "batchserve {\n  max_batch_steps: 20000")
    )
    server = start_server(root)
    yield server
    assert server.stop() == 0


def test_max_batch_steps_reserves_for_and_serves_longer_sequences(
    long_batches: ServerProcess,
) -> None:
    batchserve = _stats(long_batches)["batchserve"]
    instance = batchserve["instances"][0]  # type: ignore[index]
    assert batchserve["batch_steps"] == instance["batch_steps"] == 20000  # type: ignore[index]
    per_step = -(-int(instance["per_sample_bytes"]) // 128)
    assert instance["reserved_bytes"] == instance["fixed_bytes"] + 20000 * per_step
    assert instance["batch_cap"] == 64  # rows still batch as configured
    url = f"http://{long_batches.http_url}/v2/models/{MODEL}/infer"
    served = httpx.post(url, json=_sequences(1, 10000), timeout=60)
    assert served.status_code == 200, served.text
    assert served.json()["outputs"][0]["shape"] == [1, 98]
    past = httpx.post(url, json=_sequences(3, 10000), timeout=120)  # on memory lent for it
    assert past.status_code == 200, past.text
    assert past.json()["outputs"][0]["shape"] == [3, 98]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_gets_sequences_past_the_steps_as_a_client_s_mistake(
    budgeted: ServerProcess, protocol: str
) -> None:
    """What a Triton user calling through tritonclient sees: 400 / INVALID_ARGUMENT, never a
    500 or a hang."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = budgeted.http_url if protocol == "http" else budgeted.grpc_url
    most = int(_stats(budgeted)["batchserve"]["batch_steps"])  # type: ignore[index]
    client = module.InferenceServerClient(url)
    tokens = module.InferInput("tokens", [2, most], "INT64")
    tokens.set_data_from_numpy(np.full((2, most), 3, np.int64))
    lengths = module.InferInput("lengths", [2, 1], "INT64")
    lengths.set_data_from_numpy(np.array([[most], [most]], np.int64))
    with pytest.raises(InferenceServerException) as steps:
        client.infer(MODEL, [tokens, lengths])
    refused = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert steps.value.status() == refused
    assert f"input 'tokens': 2 sequence(s) of length {most} are" in steps.value.message()
