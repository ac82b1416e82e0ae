"""Triton's waiting rule on demand: with ``--wait-out-queue-delay`` (every model) or
``batchserve { wait_out_queue_delay }`` (one model), four requests spread over most of a
1 s queue delay share one batch on an idle server, as Triton's ``L0_batch_input`` expects of
its test models, which echo the whole batch to every request."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import MODEL_REPO, start_server

DELAY_US = 1_000_000


def _repository(tmp_path: Path, own_field: bool) -> Path:
    """digits_cnn as shipped, its queue delay 1 s, the config's own switch on or off."""
    target = tmp_path / "digits_cnn"
    shutil.copytree(MODEL_REPO / "digits_cnn", target)
    config = target / "config.pbtxt"
    text = config.read_text().replace(
        "max_queue_delay_microseconds: 25000", f"max_queue_delay_microseconds: {DELAY_US}"
    )
    assert f"max_queue_delay_microseconds: {DELAY_US}" in text
    if own_field:
        text += "\nbatchserve { wait_out_queue_delay: true }\n"
    config.write_text(text)
    return tmp_path


def _four_spread_requests(url: str) -> list[float]:
    """Four requests 150 ms apart, each from its own client; each one's latency in s."""

    def ask(index: int) -> float:
        time.sleep(0.15 * index)
        client = httpclient.InferenceServerClient(url)
        image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(np.full((1, 1, 8, 8), index, dtype=np.float32))
        started = time.monotonic()
        client.infer("digits_cnn", [image])
        client.close()
        return time.monotonic() - started

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(ask, range(4)))


def _serve_four(repository: Path, flags: list[str]) -> tuple[list[float], dict[str, Any]]:
    """A fresh server's answers to ``_four_spread_requests``, and its statistics after."""
    server = start_server(repository, flags)
    try:
        latencies = _four_spread_requests(server.http_url)
        client = httpclient.InferenceServerClient(server.http_url)
        stats: dict[str, Any] = client.get_inference_statistics("digits_cnn")["model_stats"][0]
        client.close()
    finally:
        assert server.stop() == 0
    return latencies, stats


@pytest.mark.parametrize("how", ["flag", "config"])
def test_four_requests_within_the_delay_share_one_batch(tmp_path: Path, how: str) -> None:
    flags = ["--wait-out-queue-delay", "true"] if how == "flag" else []
    latencies, stats = _serve_four(_repository(tmp_path, own_field=how == "config"), flags)
    assert (int(stats["inference_count"]), int(stats["execution_count"])) == (4, 1)
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [4]
    assert latencies[0] >= 0.9 * DELAY_US / 1e6  # the first waited out the delay


def test_by_default_the_first_request_on_an_idle_server_goes_alone(tmp_path: Path) -> None:
    latencies, stats = _serve_four(_repository(tmp_path, own_field=False), [])
    assert int(stats["inference_count"]) == 4
    assert int(stats["execution_count"]) > 1
    assert latencies[0] < 0.5
