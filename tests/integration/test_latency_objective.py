"""Latency objectives through a real server: answers counted against the objective, batch
times predicted and measured on the metrics port, and late requests refused at once with the
switch, over HTTP (503) and gRPC (UNAVAILABLE), by Triton's own clients. By one process and
by two workers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, ServerProcess, metric, start_server

REQUESTS = 48
"""Enough answers for the plans' overrun margin to be measured (``overrun.REFRESH``)."""


def _copy(repo: Path, name: str, objective_us: int, refuse: bool) -> None:
    shutil.copytree(MODEL_REPO / "digits_cnn", repo / name)
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace('name: "digits_cnn"', f'name: "{name}"')
    config.write_text(
        text + f"batchserve {{ latency_objective_microseconds: {objective_us} "
        f"refuse_late_requests: {str(refuse).lower()} }}\n"
    )


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def objective_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("objective_repo")
    _copy(repo, "digits_objective", 200_000, refuse=False)
    _copy(repo, "digits_impossible", 1, refuse=True)  # no batch can finish within 1 us
    server = start_server(repo, ["--workers", request.param])
    yield server
    assert server.stop() == 0


def _input(module: object) -> object:
    tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.full((1, 1, 8, 8), 0.5, np.float32))
    return tensor


def test_answers_are_counted_against_the_objective_and_predictions_measured(
    objective_server: ServerProcess,
) -> None:
    model = "digits_objective"

    def one(index: int) -> None:  # half over HTTP, half over gRPC: both are counted and timed
        module = httpclient if index % 2 else grpcclient
        url = objective_server.http_url if index % 2 else objective_server.grpc_url
        client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
        result = client.infer(model, [_input(module)])
        assert result.as_numpy("probabilities").shape == (1, 10)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(REQUESTS)))
    met = metric(
        objective_server, "batchserve_objective_requests_total", model=model, outcome="met"
    )
    missed = metric(
        objective_server, "batchserve_objective_requests_total", model=model, outcome="missed"
    )
    assert met + missed == REQUESTS
    assert met >= REQUESTS // 2  # 200 ms is far beyond a batch of digits_cnn
    predicted = metric(
        objective_server, "batchserve_batch_time_predicted_seconds_total", model=model
    )
    measured = metric(objective_server, "batchserve_batch_time_measured_seconds_total", model=model)
    assert predicted > 0
    assert measured > 0
    # eight clients keep the instance far from busy: waiting for company does not pay, so
    # every batch went at once, without a plan whose overrun the margin would keep free
    margin = metric(objective_server, "batchserve_objective_margin_seconds", model=model)
    assert margin == 0
    batches = {
        dispatch: metric(
            objective_server, "batchserve_objective_batches_total", model=model, dispatch=dispatch
        )
        for dispatch in ("planned", "direct")
    }
    statistics = httpclient.InferenceServerClient(objective_server.http_url)
    (row,) = statistics.get_inference_statistics(model)["model_stats"]
    assert sum(batches.values()) == int(row["execution_count"])
    assert batches["direct"] > batches["planned"]  # planned only until the rate was known
    scraped = httpx.get(f"http://127.0.0.1:{objective_server.metrics_port}/metrics").text
    assert any(
        line.startswith("batchserve_objective_margin_seconds{") and f'model="{model}"' in line
        for line in scraped.splitlines()
    )
    # a model without an objective exports none of these
    assert (
        metric(objective_server, "batchserve_objective_requests_total", model="digits_impossible")
        == 0
    )


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_request_that_cannot_meet_the_objective_is_refused_at_once(
    objective_server: ServerProcess, module: object
) -> None:
    url = objective_server.http_url if module is httpclient else objective_server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    with pytest.raises(InferenceServerException) as refused:
        client.infer("digits_impossible", [_input(module)])
    assert "cannot finish within the model's latency objective of 1 us" in refused.value.message()
    assert refused.value.status() in ("503", "StatusCode.UNAVAILABLE")
