"""A real Prometheus scrapes a real batchserve under load; the series are read back through
its HTTP API, and every query of the dashboard and the alert rules is evaluated there.
Also: promtool on the exposition, the rules (and their unit tests) and the scrape config."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.prometheus import (
    CONFIG,
    RULES,
    Prometheus,
    promtool,
    start_prometheus,
    without_kubernetes,
)
from tests.integration.server import MODEL_REPO, REPO_ROOT, ServerProcess, start_server

# batchserve itself is not imported: its generated protobuf modules would clash with
# tritonclient's in this process. The server is only reached over its sockets and logs.
pytestmark = pytest.mark.slow

DASHBOARD = REPO_ROOT / "deploy" / "grafana"
LOAD_SECONDS = 6.0
CLIENTS = 6
WINDOW = "5s"
METRIC = re.compile(r"\bbatchserve_[a-z_]+\b")
GPU_SERIES = re.compile(r"batchserve_gpu_")
# promtool's advice on names Triton chose, which batchserve keeps for Triton's tools
TRITON_NAMING = (
    'counter metrics should have "_total" suffix',
    "metric names should not contain abbreviated units",
    'non-histogram and non-summary metrics should not have "_count" suffix',
)
# digits_cnn as shipped, plus a latency objective and a memory limit of its own, so that the
# series those settings create are real too.
DIGITS_OPTIONS = (
    "batchserve { latency_objective_microseconds: 50000 memory_budget_bytes: 268435456 }"
)


@dataclass
class Load:
    """What the clients sent and saw."""

    ok: dict[str, int] = field(default_factory=lambda: {"digits_cnn": 0, "char_lstm": 0})
    invalid: int = 0
    unexpected: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _digits(rng: np.random.Generator) -> dict[str, Any]:
    rows = int(rng.integers(1, 5))
    data = rng.integers(0, 17, size=rows * 64).astype(float).tolist()
    image = {"name": "image", "datatype": "FP32", "shape": [rows, 1, 8, 8], "data": data}
    return {"inputs": [image]}


def _sentence(rng: np.random.Generator) -> dict[str, Any]:
    length = int(rng.integers(3, 40))
    tokens = rng.integers(3, 98, size=length).tolist()
    return {
        "inputs": [
            {"name": "tokens", "datatype": "INT64", "shape": [1, length], "data": tokens},
            {"name": "lengths", "datatype": "INT64", "shape": [1, 1], "data": [length]},
        ]
    }


def _client(url: str, seed: int, load: Load, until: float) -> None:
    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=url, timeout=30) as client:
        sent = 0
        while time.time() < until and sent < 5000:
            sent += 1
            model = "digits_cnn" if sent % 2 else "char_lstm"
            body = _digits(rng) if model == "digits_cnn" else _sentence(rng)
            if sent % 25 == 0:
                body["inputs"][0]["name"] = "nope"  # valid JSON, wrong input: rejected as invalid
            response = client.post(f"/v2/models/{model}/infer", json=body)
            with load.lock:
                if response.status_code == 200:
                    load.ok[model] += 1
                elif response.status_code == 400 and sent % 25 == 0:
                    load.invalid += 1
                else:
                    load.unexpected.append(f"{response.status_code} {response.text}")


def _run_load(server: ServerProcess) -> Load:
    load = Load(started=time.time())
    until = load.started + LOAD_SECONDS
    url = f"http://{server.http_url}"
    threads = [
        threading.Thread(target=_client, args=(url, seed, load, until)) for seed in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.ended = time.time()
    return load


@dataclass
class Scraped:
    server: ServerProcess
    prometheus: Prometheus
    load: Load
    exposition: str


def _repository(root: Path) -> Path:
    shutil.copytree(MODEL_REPO, root, dirs_exist_ok=True)
    config = root / "digits_cnn" / "config.pbtxt"
    config.write_text(config.read_text() + DIGITS_OPTIONS + "\n")
    return root


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    server = start_server(_repository(tmp_path_factory.mktemp("model_repo")))
    try:
        prometheus = start_prometheus(tmp_path_factory.mktemp("prometheus"), target_of(server))
        try:
            yield _scrape_under_load(server, prometheus)
        finally:
            prometheus.stop()
    finally:
        assert server.stop() == 0


def _scrape_under_load(server: ServerProcess, prometheus: Prometheus) -> Scraped:
    """Load the server, then wait until Prometheus has scraped all of it and run the rules."""
    prometheus.wait_until("target up", lambda: prometheus.query("up == 1") != [])
    load = _run_load(server)
    expr = 'sum(batchserve_requests_total{outcome="success"})'
    total = str(sum(load.ok.values()))
    prometheus.wait_until(
        f"{expr} == {total}", lambda: [r["value"][1] for r in prometheus.query(expr)] == [total]
    )
    prometheus.wait_until("rules evaluated", lambda: _rule_health(prometheus) == {"ok"})
    exposition = httpx.get(f"http://{target_of(server)}/metrics").text
    return Scraped(server, prometheus, load, exposition)


def target_of(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.metrics_port}"


def _rule_health(prometheus: Prometheus) -> set[str]:
    groups = prometheus.get("/api/v1/rules")["groups"]
    return {rule["health"] for group in groups for rule in group["rules"]}


def test_the_load_was_served(scraped: Scraped) -> None:
    assert scraped.load.unexpected == []
    assert min(scraped.load.ok.values()) > 20
    assert scraped.load.invalid > 0


def test_the_target_is_scraped_without_errors(scraped: Scraped) -> None:
    (target,) = scraped.prometheus.get("/api/v1/targets")["activeTargets"]
    assert target["health"] == "up"
    assert target["lastError"] == ""
    assert (
        target["labels"]["job"]
        == yaml.safe_load(CONFIG.read_text())["scrape_configs"][0]["job_name"]
    )


def test_request_counts_and_rate(scraped: Scraped) -> None:
    prometheus, load = scraped.prometheus, scraped.load
    for model, count in load.ok.items():
        expr = f'batchserve_requests_total{{model="{model}",outcome="success"}}'
        assert prometheus.value(expr) == count
    invalid = 'sum(batchserve_rejected_requests_total{reason="invalid"})'
    assert prometheus.value(invalid) == load.invalid
    rate = prometheus.value(
        f'sum(rate(batchserve_requests_total{{outcome="success"}}[{WINDOW}]))', at=load.ended
    )
    client_rate = sum(load.ok.values()) / (load.ended - load.started)
    assert 0.5 * client_rate < rate < 1.5 * client_rate


def test_requests_are_counted_by_protocol_and_loads_are_timed(scraped: Scraped) -> None:
    prometheus = scraped.prometheus
    for model, count in scraped.load.ok.items():
        labels = f'model="{model}",protocol="http",outcome="success"'
        assert prometheus.value(f"batchserve_requests_total{{{labels}}}") == count
        assert prometheus.value(f'batchserve_model_load_duration_seconds{{model="{model}"}}') > 0


def test_p99_latency_from_the_histogram(scraped: Scraped) -> None:
    def quantile(q: float) -> float:
        series = 'batchserve_request_duration_seconds_bucket{model="digits_cnn"}'
        buckets = f"sum by (le) (rate({series}[{WINDOW}]))"
        return scraped.prometheus.value(
            f"histogram_quantile({q}, {buckets})", at=scraped.load.ended
        )

    p50, p99 = quantile(0.5), quantile(0.99)
    assert 0 < p50 <= p99 < 2.5


def test_batch_occupancy(scraped: Scraped) -> None:
    prometheus, end = scraped.prometheus, scraped.load.ended
    model = '{model="digits_cnn"}'
    windowed = prometheus.value(
        f"sum(rate(batchserve_batch_occupancy_ratio_sum{model}[{WINDOW}])) / "
        f"sum(rate(batchserve_batch_occupancy_ratio_count{model}[{WINDOW}]))",
        at=end,
    )
    assert 0 < windowed <= 1
    occupancy = prometheus.value(
        f"sum(batchserve_batch_occupancy_ratio_sum{model}) / "
        f"sum(batchserve_batch_occupancy_ratio_count{model})"
    )
    mean_batch = prometheus.value(
        f"sum(batchserve_batch_size_sum{model}) / sum(batchserve_batch_size_count{model})"
    )
    cap = prometheus.value(f"batchserve_batch_cap{model}")
    assert occupancy == pytest.approx(mean_batch / cap)


def test_sequence_batches_report_padding(scraped: Scraped) -> None:
    expr = 'batchserve_batch_input_elements_total{model="char_lstm"}'
    assert scraped.prometheus.value(expr) > 0
    assert (
        scraped.prometheus.query('batchserve_batch_input_elements_total{model="digits_cnn"}') == []
    )


def _dashboard_queries() -> list[str]:
    spec = importlib.util.spec_from_file_location("generator", DASHBOARD / "generate_dashboard.py")
    assert spec is not None
    assert spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    dashboard = json.loads((DASHBOARD / "batchserve.json").read_text())
    queries: list[str] = generator.queries(dashboard)
    return queries


def _rule_queries() -> list[str]:
    return [
        rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_every_dashboard_query_evaluates_in_prometheus(scraped: Scraped) -> None:
    for expr in _dashboard_queries():
        concrete = expr.replace("$model", ".*").replace("$__rate_interval", WINDOW)
        result = scraped.prometheus.query(concrete, at=scraped.load.ended)
        if not GPU_SERIES.search(expr):
            assert result, f"no data: {concrete}"


def test_model_variable_lists_the_served_models(scraped: Scraped) -> None:
    values = scraped.prometheus.get(
        "/api/v1/label/model/values", **{"match[]": "batchserve_requests_total"}
    )
    assert values == ["char_lstm", "digits_cnn"]


def test_every_alert_rule_loads_and_evaluates(scraped: Scraped) -> None:
    groups = scraped.prometheus.get("/api/v1/rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(_rule_queries())
    for rule in rules:
        assert (rule["type"], rule["health"], rule.get("lastError", "")) == ("alerting", "ok", "")
    for expr in _rule_queries():
        scraped.prometheus.query(expr)


def _gpu_metrics_on(server: ServerProcess) -> bool:
    """What the server logged at start: GPU metrics on (NVML sees GPUs) or off, and why."""
    server.drain_logs()
    said = [str(r.get("message", "")) for r in server.logs]
    (state,) = [m for m in said if m.startswith("GPU metrics ")]
    return state.startswith("GPU metrics on")


def test_every_metric_name_used_is_in_the_exposition(scraped: Scraped) -> None:
    exposed = {
        sample.name
        for family in text_string_to_metric_families(scraped.exposition)
        for sample in family.samples
    }
    used = {
        name for expr in _dashboard_queries() + _rule_queries() for name in METRIC.findall(expr)
    }
    gpu_only = {name for name in used if GPU_SERIES.match(name)}
    assert used - gpu_only <= exposed, sorted(used - gpu_only - exposed)
    if _gpu_metrics_on(scraped.server):
        assert gpu_only <= exposed
    else:
        assert not [name for name in exposed if GPU_SERIES.match(name)]


def test_without_a_gpu_the_log_says_why_once(scraped: Scraped) -> None:
    if _gpu_metrics_on(scraped.server):
        pytest.skip("this machine has a GPU")
    (said,) = [r for r in scraped.server.logs if str(r["message"]).startswith("GPU metrics off")]
    assert "NVML" in str(said["reason"])


def test_promtool_finds_the_exposition_clean(scraped: Scraped) -> None:
    """Clean but for Triton's own names, kept as Triton writes them (the tools written for
    Triton read those): promtool's naming advice on them is all it may say."""
    result = promtool("check", "metrics", input_text=scraped.exposition)
    assert result.returncode in (0, 3), result.stdout + result.stderr  # 3: naming advice only
    said = result.stdout + result.stderr
    advice = [line for line in said.splitlines() if line.strip()]
    assert advice, "Triton's families are missing from the exposition"
    not_tritons = [
        line for line in advice if not (line.startswith("nv_") and line.endswith(TRITON_NAMING))
    ]
    assert not_tritons == []


def test_tritons_series_are_scraped_under_tritons_names(scraped: Scraped) -> None:
    """Prometheus asks for OpenMetrics, where Triton's counters go as ``unknown``: their
    series keep Triton's names, and PromQL over them is what a Triton dashboard runs."""
    prometheus, load = scraped.prometheus, scraped.load
    for model, count in load.ok.items():
        assert prometheus.value(f'nv_inference_request_success{{model="{model}"}}') == count
    other = 'sum(nv_inference_request_failure{reason="OTHER"})'
    assert prometheus.value(other) == load.invalid
    digits = '{model="digits_cnn"}'
    mean_batch = prometheus.value(f"nv_inference_count{digits} / nv_inference_exec_count{digits}")
    assert mean_batch == pytest.approx(
        prometheus.value(
            f"sum(batchserve_batch_size_sum{digits}) / sum(batchserve_batch_size_count{digits})"
        )
    )
    queue_us = prometheus.value(
        f"rate(nv_inference_queue_duration_us{digits}[{WINDOW}]) / "
        f"rate(nv_inference_request_success{digits}[{WINDOW}])",
        at=load.ended,
    )
    assert 0 <= queue_us < 2_500_000
    assert prometheus.query("nv_inference_pending_request_count") != []


# The queries of the Grafana dashboard Triton ships for Kubernetes (deploy/k8s-onprem in
# Triton's repository), as it writes them, and of its autoscaling rule; ``pod`` comes from
# Kubernetes' relabelling, absent here, which leaves one group.
TRITON_DASHBOARD = (
    "count(count(nv_inference_count) by (instance))",
    "sum by (pod) (rate(nv_inference_count[1m])) / ignoring(pod) group_left "
    "sum (rate(nv_inference_count[1m]))",
    "sum(nv_inference_request_success) by (pod)",
    "sum(nv_inference_request_failure) by (pod)",
    "sum(rate(nv_inference_compute_infer_duration_us[30s])) by (model) / 1000",
    "avg(rate(nv_inference_queue_duration_us[30s])/(1+rate(nv_inference_request_success[30s]))) "
    "by (pod)",
    # and the prometheus-adapter rule of its Helm chart, behind the autoscaler's
    # avg_time_queue_us (label matchers and grouping filled in as the adapter fills them)
    "avg(delta(nv_inference_queue_duration_us{}[30s])/(1+delta(nv_inference_request_success{}"
    "[30s]))) by (job)",
)


def test_tritons_own_dashboard_queries_find_data(scraped: Scraped) -> None:
    for expr in TRITON_DASHBOARD:
        assert scraped.prometheus.query(expr, at=scraped.load.ended), f"no data: {expr}"
    (share,) = scraped.prometheus.query(TRITON_DASHBOARD[1], at=scraped.load.ended)
    assert float(share["value"][1]) == pytest.approx(1.0)  # one server does all the work
    by_model = scraped.prometheus.query(TRITON_DASHBOARD[4], at=scraped.load.ended)
    assert {row["metric"]["model"] for row in by_model} >= {"digits_cnn", "char_lstm"}


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    checked = promtool("check", "rules", "rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "rules_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    """Debian's promtool has no Kubernetes discovery: the shipped config is checked with a
    static target in its place, relabelling kept."""
    shipped = yaml.safe_load(CONFIG.read_text())
    config = without_kubernetes(shipped, "127.0.0.1:8002", "15s")
    for job, original in zip(config["scrape_configs"], shipped["scrape_configs"], strict=True):
        job["relabel_configs"] = original["relabel_configs"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
