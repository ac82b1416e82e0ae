"""A model's queue limit counts requests, however they reach it: Triton's L0_model_queue
``test_max_queue_size``, by one process and by two request-handling workers, whose requests
travel to the model-owning process in groups (``handoff/groups.py``)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import write_ensemble
from tests.integration.server import metric, start_server
from tests.integration.slow_model import WIDTH, write_slow_model
from tests.integration.test_faults import wait_until

QUEUE = 8
SENT = 10
BLOCK_ITERATIONS = 2000
"""Seconds of work on a 2-core machine, and still a second where many cores share it: the ten
requests, sent once the instance is busy, reach the queue in milliseconds."""


ENSEMBLE = """
name: "through_ensemble"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "iterations" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "slow"
  input_map { key: "x" value: "x" }
  input_map { key: "iterations" value: "iterations" }
  output_map { key: "y" value: "y" }
} ] }
"""
"""The slow model behind an ensemble: its queue refuses the ensemble's steps."""


def ask(url: str, iterations: int, model: str = "slow", priority: int = 0) -> str:
    """One request of ``iterations`` to ``model``: "ok", or the error's message."""
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("x", [1, WIDTH], "FP32")
    x.set_data_from_numpy(np.ones((1, WIDTH), dtype=np.float32))
    count = httpclient.InferInput("iterations", [1, 1], "INT64")
    count.set_data_from_numpy(np.array([[iterations]], dtype=np.int64))
    try:
        client.infer(model, [x, count], priority=priority)
        return "ok"
    except InferenceServerException as exc:
        return exc.message()
    finally:
        client.close()


@pytest.mark.parametrize("model", ["slow", "through_ensemble"])
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
def test_requests_past_the_queue_limit_are_refused_however_they_travel(
    tmp_path: Path, workers: str, model: str
) -> None:
    """One request keeps the only instance busy for seconds; ten more arrive at once, of
    which the queue holds eight: exactly two are refused, in Triton's words, whether sent
    to the model or through an ensemble whose step it is."""
    write_slow_model(tmp_path, "slow", max_queue_size=QUEUE, max_batch_size=8)
    write_ensemble(tmp_path, ENSEMBLE, "through_ensemble")
    server = start_server(tmp_path, ["--workers", workers])
    try:
        first: list[str] = []
        busy = threading.Thread(
            target=lambda: first.append(ask(server.http_url, BLOCK_ITERATIONS, model))
        )
        busy.start()
        wait_until(lambda: metric(server, "batchserve_busy_instances", model="slow") == 1)
        with ThreadPoolExecutor(SENT) as pool:
            answers = list(pool.map(lambda _: ask(server.http_url, 1, model), range(SENT)))
        busy.join()
        assert first == ["ok"]
        refused = [a for a in answers if a != "ok"]
        assert len(refused) == SENT - QUEUE, answers
        prefix = "" if model == "slow" else f"in ensemble '{model}', "
        assert all(a.startswith(f"{prefix}Exceeds maximum queue size") for a in refused), refused
    finally:
        assert server.stop() == 0
