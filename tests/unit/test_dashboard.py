"""The Grafana dashboard: generated from code, valid against the SDK's schema types, every
panel on the datasource variable and every per-model query behind the model filter."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as schema
from grafana_foundation_sdk.models import prometheus, timeseries

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
POD_OR_DEVICE_METRICS = re.compile(
    r"batchserve_(saturation|memory_budget|memory_reserved|memory_lent|request_memory|gpu_)"
)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generate_dashboard", GRAFANA / "generate_dashboard.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return _generator()


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GRAFANA / "batchserve.json").read_text())
    return data


def test_committed_json_is_exactly_what_the_generator_writes(generator: ModuleType) -> None:
    assert generator.render() == (GRAFANA / "batchserve.json").read_text(), (
        "deploy/grafana/batchserve.json is stale: run `make dashboards`"
    )


def test_json_round_trips_through_the_schema_types_without_loss(committed: dict[str, Any]) -> None:
    """The SDK's models are generated from Grafana's dashboard schema: parsing into them drops
    any key the schema does not define, so a lossless round trip means none is unknown."""
    register_default_plugins()
    parsed = schema.Dashboard.from_json(committed)
    assert json.loads(JSONEncoder().encode(parsed)) == committed
    panels = [p for p in parsed.panels or [] if isinstance(p, schema.Panel)]
    assert len(panels) >= 15
    for panel in panels:
        assert panel.type_val == "timeseries"
        assert panel.field_config is not None
        assert isinstance(panel.field_config.defaults.custom, timeseries.FieldConfig)
        assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets or [])


def test_a_datasource_variable_and_a_model_filter(committed: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in committed["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["query"] == "label_values(batchserve_requests_total, model)"
    assert (model["multi"], model["includeAll"], model["allValue"]) == (True, True, ".*")
    source = {"type": "prometheus", "uid": "${datasource}"}
    for panel in committed["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == source
            assert all(target["datasource"] == source for target in panel["targets"])


def test_every_per_model_query_uses_the_model_filter(
    generator: ModuleType, committed: dict[str, Any]
) -> None:
    exprs = generator.queries(committed)
    assert len(exprs) >= 30
    for expr in exprs:
        if not POD_OR_DEVICE_METRICS.search(expr):
            assert 'model=~"$model"' in expr, expr


def test_the_panels_the_issue_asks_for(committed: dict[str, Any]) -> None:
    titles = {panel["title"] for panel in committed["panels"]}
    assert {
        "Throughput", "End-to-end latency", "Queue latency", "Compute latency", "Batch size",
        "Batch occupancy", "Queue depth and in-flight requests", "Rejected and failed requests",
        "Memory per model", "Memory per device", "GPU utilisation",
    } <= titles  # fmt: skip
    latency = next(p for p in committed["panels"] if p["title"] == "Queue latency")
    assert [t["legendFormat"] for t in latency["targets"]] == [
        "{{model}} p50", "{{model}} p95", "{{model}} p99",
    ]  # fmt: skip
