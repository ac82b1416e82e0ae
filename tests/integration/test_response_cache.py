"""Triton's response cache (L0_response_cache): ``--cache-config local,size=N`` and a model
whose config sets ``response_cache { enable: true }``, over HTTP and gRPC, by one process
and by two workers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server import MODEL_REPO, ServerProcess, metric, start_server

CACHED, PLAIN = "digits_cached", "digits_plain"


def _repo(root: Path) -> Path:
    for name, extra in ((CACHED, "response_cache { enable: true }\n"), (PLAIN, "")):
        shutil.copytree(MODEL_REPO / "digits_cnn", root / name)
        config = root / name / "config.pbtxt"
        config.write_text(
            config.read_text().replace('name: "digits_cnn"', f'name: "{name}"') + extra
        )
    return root


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def cache_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("cache_repo"))
    server = start_server(
        repo, ["--workers", request.param, "--cache-config", "local,size=1048576"]
    )
    yield server
    assert server.stop() == 0


def _infer(module: Any, url: str, model: str, seed: int) -> np.ndarray:
    client = module.InferenceServerClient(url)
    image = np.random.default_rng(seed).random((1, 1, 8, 8), dtype=np.float32)
    tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(image)
    return np.asarray(client.infer(model, [tensor]).as_numpy("logits"))


def _cache_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(server.http_url)
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    inference = stats["inference_stats"]
    return int(inference["cache_hit"]["count"]), int(inference["cache_miss"]["count"])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_repeated_request_is_a_cache_hit_with_the_same_answer(
    cache_server: ServerProcess, module: Any
) -> None:
    url = cache_server.http_url if module is httpclient else cache_server.grpc_url
    seed = 1 if module is httpclient else 2
    hits, misses = _cache_counts(cache_server, CACHED)
    executions = metric(cache_server, "nv_inference_exec_count_total", model=CACHED)
    first = _infer(module, url, CACHED, seed)
    again = _infer(module, url, CACHED, seed)
    np.testing.assert_array_equal(again, first)
    assert _cache_counts(cache_server, CACHED) == (hits + 1, misses + 1)
    assert metric(cache_server, "nv_inference_exec_count_total", model=CACHED) == executions + 1
    assert metric(cache_server, "nv_cache_num_hits_per_model_total", model=CACHED) == hits + 1
    assert metric(cache_server, "nv_cache_num_misses_per_model_total", model=CACHED) == misses + 1
    different = _infer(module, url, CACHED, seed + 10)
    assert not np.array_equal(different, first)
    assert _cache_counts(cache_server, CACHED) == (hits + 1, misses + 2)


def test_a_model_without_response_cache_is_never_cached(cache_server: ServerProcess) -> None:
    for _ in range(2):
        _infer(httpclient, cache_server.http_url, PLAIN, 3)
    assert _cache_counts(cache_server, PLAIN) == (0, 0)
    assert metric(cache_server, "nv_cache_num_hits_per_model_total", model=PLAIN) == 0  # no series


def test_without_cache_config_a_model_asking_for_the_cache_runs_every_request(
    tmp_path: Path,
) -> None:
    """As Triton: the config's response_cache takes effect only with a cache configured."""
    server = start_server(_repo(tmp_path))
    try:
        for _ in range(2):
            _infer(httpclient, server.http_url, CACHED, 4)
        assert _cache_counts(server, CACHED) == (0, 0)
        assert metric(server, "nv_inference_exec_count_total", model=CACHED) == 2
    finally:
        assert server.stop() == 0


def _series(server: ServerProcess, model: str) -> set[str]:
    """The sample names on the metrics port that carry ``model``'s label."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return {
        sample.name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model") == model
    }


def test_summaries_of_a_cached_model_are_tritons_cache_hit_and_miss_ones(tmp_path: Path) -> None:
    """With summary_latencies, Triton summarizes a cached model's hits and misses and
    leaves out its request summary, which cached answers would skew
    (metric_model_reporter.cc); a model without the cache keeps its request summary."""
    args = ["--cache-config", "local,size=1048576", "--metrics-config", "summary_latencies=true"]
    server = start_server(_repo(tmp_path), args)
    try:
        for _ in range(3):
            _infer(httpclient, server.http_url, CACHED, 5)
        _infer(httpclient, server.http_url, PLAIN, 5)
        cached, plain = _series(server, CACHED), _series(server, PLAIN)
        assert metric(server, "nv_cache_hit_summary_per_model_count", model=CACHED) == 2
        assert metric(server, "nv_cache_miss_summary_per_model_count", model=CACHED) == 1
        assert metric(server, "nv_cache_hit_summary_per_model", model=CACHED, quantile="0.5") > 0
    finally:
        assert server.stop() == 0
    assert "nv_inference_request_summary_us_count" not in cached
    assert "nv_inference_queue_summary_us_count" in cached
    assert "nv_inference_request_summary_us_count" in plain
    assert not any(name.startswith("nv_cache_") for name in plain)
