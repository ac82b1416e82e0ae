"""Generate the batchserve Grafana dashboard (batchserve.json) with grafana-foundation-sdk.

    python deploy/grafana/generate_dashboard.py          # rewrite batchserve.json
    python deploy/grafana/generate_dashboard.py --check  # exit 1 if it is out of date

The dashboard is code so that it moves with the metric names: a test regenerates it,
diffs it with the committed JSON and evaluates every query in a real Prometheus.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

OUTPUT = Path(__file__).with_name("batchserve.json")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
MODEL = 'model=~"$model"'
RATE = "[$__rate_interval]"
QUANTILES = (0.5, 0.95, 0.99)


def _query(expr: str, legend: str) -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _panel(title: str, unit: str, description: str, *queries: Dataquery, width: int = 8) -> Panel:
    panel = (
        Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .min(0)
        .fill_opacity(10)
    )
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        panel = panel.with_target(query.ref_id(ref))
    return panel


def _rate(metric: str, by: str = "model", selector: str = MODEL) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}{RATE}))"


def _quantiles(metric: str) -> list[Dataquery]:
    """p50/p95/p99 of one latency histogram, per model."""
    buckets = _rate(f"{metric}_bucket", "model, le")
    return [
        _query(f"histogram_quantile({q}, {buckets})", f"{{{{model}}}} p{round(q * 100)}")
        for q in QUANTILES
    ]


def _mean(histogram: str) -> str:
    return f"{_rate(histogram + '_sum')} / {_rate(histogram + '_count')}"


def traffic() -> list[Panel]:
    return [
        _panel(
            "Throughput",
            "reqps",
            "Requests answered successfully, and samples inferred, per second.",
            _query(
                _rate("batchserve_requests_total", selector=f'{MODEL},outcome="success"'),
                "{{model}} requests",
            ),
            _query(_rate("batchserve_batch_size_sum"), "{{model}} samples"),
        ),
        _panel(
            "Rejected and failed requests",
            "reqps",
            "Rejections by reason (queue full, timeout, cancelled, invalid) and every failure.",
            _query(
                _rate("batchserve_rejected_requests_total", "model, reason"), "{{model}} {{reason}}"
            ),
            _query(
                _rate("batchserve_requests_total", selector=f'{MODEL},outcome="failure"'),
                "{{model}} all failures",
            ),
        ),
        _panel(
            "Saturation",
            "percentunit",
            "Per pod: queue wait over the delay budget, or queued samples over one batch per "
            "instance, whichever is higher. 100 % is capacity; the autoscaler's signal.",
            _query("max by (instance) (batchserve_saturation)", "{{instance}}"),
        ),
    ]


def latency() -> list[Panel]:
    objective = _query(
        f"max by (model) (batchserve_model_latency_objective_seconds{{{MODEL}}})",
        "{{model}} objective",
    )
    return [
        _panel(
            "End-to-end latency",
            "s",
            "Successful requests, arrival to answer.",
            *_quantiles("batchserve_request_duration_seconds"),
            objective,
        ),
        _panel(
            "Queue latency",
            "s",
            "Time successful requests waited for their batch.",
            *_quantiles("batchserve_queue_duration_seconds"),
        ),
        _panel(
            "Compute latency",
            "s",
            "Time one model execution took.",
            *_quantiles("batchserve_compute_duration_seconds"),
        ),
        _panel(
            "Latency objective",
            "percentunit",
            "Models with a latency objective: share of answers within it, and the margin the "
            "dispatch's plans keep for their recent overruns, as a share of the objective.",
            _query(
                _rate("batchserve_objective_requests_total", selector=f'{MODEL},outcome="met"')
                + " / "
                + _rate("batchserve_objective_requests_total"),
                "{{model}} within",
            ),
            _query(
                f"max by (model) (batchserve_objective_margin_seconds{{{MODEL}}}) / "
                f"max by (model) (batchserve_model_latency_objective_seconds{{{MODEL}}})",
                "{{model}} margin",
            ),
        ),
    ]


def batching() -> list[Panel]:
    return [
        _panel(
            "Batch size",
            "short",
            "Samples per model execution, and the batch cap.",
            _query(_mean("batchserve_batch_size"), "{{model}} mean"),
            _query(
                f"histogram_quantile(0.95, {_rate('batchserve_batch_size_bucket', 'model, le')})",
                "{{model}} p95",
            ),
            _query(f"max by (model) (batchserve_batch_cap{{{MODEL}}})", "{{model}} cap"),
        ),
        _panel(
            "Batch occupancy",
            "percentunit",
            "Mean batch size over the batch cap.",
            _query(_mean("batchserve_batch_occupancy_ratio"), "{{model}}"),
        ),
        _panel(
            "Queue depth and in-flight requests",
            "short",
            "Requests waiting in the queue, and received but not yet answered.",
            _query(f"sum by (model) (batchserve_queue_depth{{{MODEL}}})", "{{model}} queued"),
            _query(
                f"sum by (model) (batchserve_inflight_requests{{{MODEL}}})", "{{model}} in flight"
            ),
        ),
        _panel(
            "Busy instances",
            "percentunit",
            "Share of model instances running a batch.",
            _query(
                f"sum by (model) (batchserve_busy_instances{{{MODEL}}}) / "
                f"sum by (model) (batchserve_instances{{{MODEL}}})",
                "{{model}}",
            ),
        ),
        _panel(
            "Padding waste",
            "percentunit",
            "Sequence models: share of the input elements that were padding.",
            _query(
                f"{_rate('batchserve_batch_padding_elements_total')} / "
                f"{_rate('batchserve_batch_input_elements_total')}",
                "{{model}}",
            ),
        ),
        _panel(
            "Out-of-memory splits",
            "short",
            "Batches split and retried after running out of memory (each lowers the cap).",
            _query(
                f"sum by (model) (increase(batchserve_oom_splits_total{{{MODEL}}}{RATE}))",
                "{{model}}",
            ),
        ),
        _panel(
            "Batches stopped",
            "short",
            "Running batches stopped because their clients all went away: compute saved "
            "for answers nobody would read (ONNX Runtime models).",
            _query(
                f"sum by (model) (increase(batchserve_stopped_batches_total{{{MODEL}}}{RATE}))",
                "{{model}}",
            ),
        ),
    ]


def memory() -> list[Panel]:
    return [
        _panel(
            "Memory per model",
            "bytes",
            "Memory reserved by each model's instances per device, and the model's own limit.",
            _query(
                f"sum by (model, device) (batchserve_model_memory_bytes{{{MODEL}}})",
                "{{model}} {{device}}",
            ),
            _query(
                f"max by (model) (batchserve_model_memory_budget_bytes{{{MODEL}}})",
                "{{model}} budget",
            ),
            width=12,
        ),
        _panel(
            "Memory per device",
            "bytes",
            "Per pod and device: the budget, what loaded models reserved of it, what is lent "
            "to batches larger than their reservation while they run, and on GPUs the memory "
            "in use (NVML) and installed. Per pod: the bodies and answers of requests in "
            "flight, and what --max-request-memory allows them (past it, 503 / UNAVAILABLE).",
            _query("batchserve_memory_budget_bytes", "{{instance}} {{device}} budget"),
            _query("batchserve_memory_reserved_bytes", "{{instance}} {{device}} reserved"),
            _query("batchserve_memory_lent_bytes", "{{instance}} {{device}} lent"),
            _query("batchserve_gpu_memory_used_bytes", "{{instance}} {{device}} used"),
            _query("batchserve_gpu_memory_total_bytes", "{{instance}} {{device}} total"),
            _query("batchserve_request_memory_held_bytes", "{{instance}} requests in flight"),
            _query("batchserve_request_memory_limit_bytes", "{{instance}} requests' limit"),
            width=12,
        ),
    ]


def gpus() -> list[Panel]:
    return [
        _panel(
            "GPU utilisation",
            "percentunit",
            "Share of time a kernel ran, per GPU.",
            _query("batchserve_gpu_utilization_ratio", "{{instance}} {{device}}"),
        ),
        _panel(
            "GPU temperature",
            "celsius",
            "Core temperature per GPU.",
            _query("batchserve_gpu_temperature_celsius", "{{instance}} {{device}}"),
        ),
        _panel(
            "GPU power",
            "watt",
            "Board power draw per GPU.",
            _query("batchserve_gpu_power_watts", "{{instance}} {{device}}"),
        ),
    ]


def models() -> list[Panel]:
    return [
        _panel(
            "Models not ready",
            "short",
            "1 while a model is loading, unloading or failed.",
            _query(
                f'sum by (model, state) (batchserve_model_state{{{MODEL},state!="READY"}})',
                "{{model}} {{state}}",
            ),
            width=12,
        ),
        _panel(
            "Model load time",
            "s",
            "How long the latest load of each model took.",
            _query(
                f"max by (model) (batchserve_model_load_duration_seconds{{{MODEL}}})", "{{model}}"
            ),
            width=12,
        ),
    ]


def variables(dashboard: Dashboard) -> Dashboard:
    datasource = DatasourceVariable("datasource").label("Data source").type("prometheus")
    model = (
        QueryVariable("model")
        .label("Model")
        .datasource(DATASOURCE)
        .query("label_values(batchserve_requests_total, model)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    return dashboard.with_variable(datasource).with_variable(model)


def build() -> Dashboard:
    dashboard = variables(
        Dashboard("batchserve")
        .uid("batchserve")
        .description("Inference server: traffic, latency, batching, memory and GPUs per model.")
        .tags(["batchserve", "inference"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
    )
    sections = (
        ("Traffic", traffic()),
        ("Latency", latency()),
        ("Batching", batching()),
        ("Memory", memory()),
        ("GPUs", gpus()),
        ("Models", models()),
    )
    panel_id = 0
    for title, panels in sections:
        panel_id += 1
        dashboard = dashboard.with_row(Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            dashboard = dashboard.with_panel(panel.id(panel_id))
    return dashboard


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard's panels (rows' nested panels included)."""
    panels = list(dashboard.get("panels", []))
    for row in list(panels):
        panels.extend(row.get("panels", []))
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def render() -> str:
    """The dashboard's JSON exactly as committed."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT.name} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
