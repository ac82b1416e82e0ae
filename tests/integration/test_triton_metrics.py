"""Triton's metric families on a real server, read by what reads Triton's.

- The ``nv_inference_*`` series are the Triton statistics tritonclient reads, by one process
  and through two workers (one consistent view), parsed as Model Analyzer parses them.
- On a machine whose NVML reports two GPUs (the NVML stub; the server's Python without
  cuda-python, as the base install is, so NVML's count is the one there is), NVIDIA's
  perf_analyzer collects the server's GPU figures with ``--collect-metrics``, and the GPUs
  are listed by UUID as Model Analyzer's check compares them.
"""

from __future__ import annotations

import csv
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, ServerProcess, run_perf_analyzer, start_server
from tests.stubs.nvml import build_driver_stub, build_nvml_stub

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
MODEL = "digits_cnn"
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
STUB_GPUS = {
    "NVML_STUB_GPUS": "2",
    "NVML_STUB_NAMES": "NVIDIA H100 80GB HBM3,NVIDIA L4",
    "NVML_STUB_UUIDS": (
        "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9,GPU-f9e8d7c6-b5a4-9382-7160-5f4e3d2c1b0a"
    ),
    "NVML_STUB_MEMORY_TOTAL": f"{80 << 30},{24 << 30}",
    "NVML_STUB_MEMORY_USED": f"{3 << 30},{1 << 30}",
    "NVML_STUB_UTILIZATION": "64,8",
    "NVML_STUB_POWER_MW": "412500,31000",
    "NVML_STUB_POWER_LIMIT_MW": "700000,72000",
    "NVML_STUB_ENERGY_STEP_MJ": "2000,500",
}


def _scrape(server: ServerProcess) -> tuple[str, Samples]:
    """The metrics port's text as a client without an Accept header gets it, and its samples
    as prometheus_client's parser names them (Model Analyzer reads Triton's with it)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, samples


def _statistics(client: httpclient.InferenceServerClient) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics(MODEL)["model_stats"]
    return dict(stats)


def _images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).random((rows, 1, 8, 8), dtype=np.float32)


def _send(server: ServerProcess) -> None:
    """Requests over both protocols, and one HTTP request naming an input the model lacks."""
    with httpclient.InferenceServerClient(server.http_url) as http:
        for rows in (1, 3, 2):
            tensor = httpclient.InferInput("image", [rows, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(_images(rows))
            http.infer(MODEL, [tensor])
        wrong = httpclient.InferInput("picture", [1, 1, 8, 8], "FP32")
        wrong.set_data_from_numpy(_images(1))
        with pytest.raises(InferenceServerException):
            http.infer(MODEL, [wrong])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("image", [4, 1, 8, 8], "FP32")
        tensor.set_data_from_numpy(_images(4))
        grpc.infer(MODEL, [tensor])
    finally:
        grpc.close()


def _still(server: ServerProcess) -> tuple[dict[str, Any], str, Samples]:
    """Statistics and a scrape taken with nothing answered in between (the statistics read
    the same before and after the scrape)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(50):
            before = _statistics(client)
            text, samples = _scrape(server)
            if _statistics(client) == before:
                return before, text, samples
            time.sleep(0.1)
    raise AssertionError("the model's statistics kept changing")


def _of(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"model": MODEL, "version": "1", **labels}.items()))]


def test_tritons_series_are_the_statistics_tritonclient_reads(
    server_either_way: ServerProcess,
) -> None:
    _send(server_either_way)
    stats, text, samples = _still(server_either_way)
    inference = stats["inference_stats"]
    # prometheus_client's parser names a counter's sample <family>_total
    assert _of(samples, "nv_inference_request_success_total") == int(inference["success"]["count"])
    failed = {r: _of(samples, "nv_inference_request_failure_total", reason=r) for r in REASONS}
    assert sum(failed.values()) == int(inference["fail"]["count"])
    assert failed["OTHER"] >= 1  # the request naming an input the model lacks
    assert _of(samples, "nv_inference_count_total") == int(stats["inference_count"])
    assert _of(samples, "nv_inference_exec_count_total") == int(stats["execution_count"])
    durations = {
        "nv_inference_request_duration_us_total": "success",
        "nv_inference_queue_duration_us_total": "queue",
        "nv_inference_compute_input_duration_us_total": "compute_input",
        "nv_inference_compute_infer_duration_us_total": "compute_infer",
        "nv_inference_compute_output_duration_us_total": "compute_output",
    }
    for series, field in durations.items():
        assert _of(samples, series) == int(inference[field]["ns"]) // 1000, series
    # Triton counts compute per request answered, each adding its batch's time
    assert int(inference["compute_infer"]["count"]) == int(inference["success"]["count"])
    assert _of(samples, "nv_inference_pending_request_count") == 0
    assert _of(samples, "nv_model_load_duration_secs") > 0
    assert 0 <= samples[("nv_cpu_utilization", frozenset())] <= 1
    # Triton's exposition, not prometheus_client's: the counter's own name, no _total
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert f'\nnv_inference_request_success{{model="{MODEL}",version="1"}} ' in text


def _start_on_stub_gpus(root: Path, *args: str) -> ServerProcess:
    """A server whose NVML reports two GPUs, with no cuda-python (NVML then counts them);
    digits_cnn on CPU instances (no device runs)."""
    build_nvml_stub(root / "lib")
    build_driver_stub(root / "lib")
    hidden = root / "no_cuda_python" / "cuda"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("cuda-python is not installed")\n')
    repo = root / "repo"
    shutil.copytree(MODEL_REPO / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + "instance_group { kind: KIND_CPU }\n")
    env = {**STUB_GPUS, "LD_LIBRARY_PATH": str(root / "lib"),
           "PYTHONPATH": str(hidden.parent)}  # fmt: skip
    return start_server(repo, list(args), extra_env=env)


@pytest.fixture(scope="module")
def stub_gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _start_on_stub_gpus(tmp_path_factory.mktemp("stub_gpus"))
    yield server
    assert server.stop() == 0


def test_perf_analyzer_collects_the_gpu_metrics(
    stub_gpu_server: ServerProcess, tmp_path: Path
) -> None:
    report = tmp_path / "report.csv"
    metrics_url = f"127.0.0.1:{stub_gpu_server.metrics_port}/metrics"
    run_perf_analyzer(
        MODEL, "http", stub_gpu_server.http_url, "--collect-metrics",
        "--metrics-url", metrics_url, "--metrics-interval", "100",
        "-f", str(report), "--verbose-csv",
    )  # fmt: skip
    (row,) = csv.DictReader(report.read_text().splitlines())
    first, second = STUB_GPUS["NVML_STUB_UUIDS"].split(",")

    def per_gpu(column: str) -> dict[str, float]:
        cells = [cell.split(":") for cell in row[column].split(";") if cell]
        return {uuid: float(value) for uuid, value in cells}

    assert per_gpu("Avg GPU Utilization") == {first: 0.64, second: 0.08}
    assert per_gpu("Avg GPU Power Usage") == {first: 412.5, second: 31.0}
    assert per_gpu("Max GPU Memory Usage") == {first: 3 << 30, second: 1 << 30}
    assert per_gpu("Total GPU Memory") == {first: 80 << 30, second: 24 << 30}


def test_the_gpus_are_listed_by_uuid_with_limit_and_energy(stub_gpu_server: ServerProcess) -> None:
    uuids = STUB_GPUS["NVML_STUB_UUIDS"].split(",")
    _, samples = _scrape(stub_gpu_server)
    listed = sorted(labels for name, labels in samples if name == "nv_gpu_utilization")
    assert listed == sorted(frozenset({("gpu_uuid", uuid)}) for uuid in uuids)
    limits = [samples[("nv_gpu_power_limit", frozenset({("gpu_uuid", u)}))] for u in uuids]
    assert limits == [700, 72]

    def energy() -> list[float]:
        _, now = _scrape(stub_gpu_server)
        return [now[("nv_energy_consumption_total", frozenset({("gpu_uuid", u)}))] for u in uuids]

    earlier = energy()
    time.sleep(0.3)  # past the 0.2 s within which one scrape's readings are reused
    later = energy()
    # one NVML reading each scrape, batchserve's series and Triton's written from it
    assert [b - a for a, b in zip(earlier, later, strict=True)] == [2.0, 0.5]


def test_tritons_switches_turn_the_gpu_and_host_series_off(tmp_path: Path) -> None:
    server = _start_on_stub_gpus(tmp_path, "--allow-gpu-metrics=false", "--allow-cpu-metrics", "0")
    try:
        _, samples = _scrape(server)
        server.drain_logs()
        said = [str(record.get("message", "")) for record in server.logs]
    finally:
        assert server.stop() == 0
    names = {name for name, _ in samples}
    assert "nv_inference_request_success_total" in names
    off = ("nv_gpu_", "nv_energy_", "nv_cpu_", "batchserve_gpu_")
    assert sorted(name for name in names if name.startswith(off)) == []
    assert "GPU metrics off: turned off (--allow-gpu-metrics false)" in said


def test_with_metrics_off_no_port_serves_them_and_inference_goes_on(tmp_path: Path) -> None:
    shutil.copytree(MODEL_REPO / MODEL, tmp_path / MODEL)
    server = start_server(tmp_path, ["--allow-metrics", "false"])
    try:
        (listening,) = [record for record in server.logs if record.get("message") == "listening"]
        with httpclient.InferenceServerClient(server.http_url) as client:
            tensor = httpclient.InferInput("image", [2, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(_images(2))
            assert client.infer(MODEL, [tensor]).as_numpy("logits").shape == (2, 10)
    finally:
        assert server.stop() == 0  # drained and exited cleanly without a metrics listener
    assert listening["metrics_port"] is None


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_metrics_config_picks_tritons_latency_families(tmp_path: Path, workers: str) -> None:
    """Triton's --metrics-config (L0_metrics' metrics_config_test): counters off, the five
    summaries with the asked quantiles, the first-response histogram with the model's own
    buckets. A command line with the flag used to be refused."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / MODEL)
    config = tmp_path / MODEL / "config.pbtxt"
    config.write_text(
        config.read_text() + "model_metrics { metric_control [{ metric_identifier { family: "
        '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [1, 10000] } '
        "}] }\n"
    )
    args = ["--workers", workers, "--metrics-config", "counter_latencies=false",
            "--metrics-config", "summary_latencies=true",
            "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
            "--metrics-config=histogram_latencies=true"]  # fmt: skip
    server = start_server(tmp_path, args)
    try:
        _, before = _scrape(server)
        with httpclient.InferenceServerClient(server.http_url) as http:
            for rows in (1, 2, 3, 4, 5):
                tensor = httpclient.InferInput("image", [rows, 1, 8, 8], "FP32")
                tensor.set_data_from_numpy(_images(rows))
                http.infer(MODEL, [tensor])
        text, samples = _scrape(server)
    finally:
        assert server.stop() == 0
    assert "nv_inference_request_duration_us" not in text  # counter_latencies=false
    assert _of(samples, "nv_inference_request_success_total") == 5
    for stage in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        name = f"nv_inference_{stage}_summary_us"
        assert f"# TYPE {name} summary" in text
        assert _of(samples, f"{name}_count") == 5
        middle, high = (_of(samples, name, quantile=q) for q in ("0.5", "0.99"))
        assert 0 <= middle <= high <= _of(samples, f"{name}_sum") <= 10_000_000  # µs
        asked = {dict(key).get("quantile") for sample, key in samples if sample == name}
        assert asked == {"0.5", "0.99"}
    histogram = "nv_inference_first_response_histogram_ms"
    assert f"# TYPE {histogram} histogram" in text
    bounds = {dict(key)["le"] for sample, key in samples if sample == f"{histogram}_bucket"}
    assert bounds == {"1", "10000", "+Inf"}  # the model's own, as prometheus-cpp writes them
    assert _of(samples, f"{histogram}_bucket", le="10000") == 5
    assert _of(samples, f"{histogram}_count") == 5
    # before any request, as Triton's: there, with no observation (count 0, quantiles NaN)
    assert _of(before, "nv_inference_request_summary_us_count") == 0
    assert math.isnan(_of(before, "nv_inference_request_summary_us", quantile="0.5"))
