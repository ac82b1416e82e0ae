"""The metrics body: prometheus_client's families, then Triton's written as Triton writes them
(bare counter names, labels in name order, integral values as integers) in both formats."""

from __future__ import annotations

import gzip
import re

from batchserve.observability.exposition import Family, metrics_body, render
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# perf_analyzer's reading of a GPU series (its client backend's regular expression)
PERF_ANALYZER_GPU = r"\n{name}\{{gpu_uuid\=\"([^\"]+)\"\}} (\d+\.?\d*)"


class _Fixed:
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> list[Metric]:
        return [self._family]


def _families() -> list[Family]:
    success = Family("nv_inference_request_success", "Number of successful requests", "counter")
    success.add({"version": "1", "model": 'odd"name\\'}, 7)
    memory = Family("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge")
    memory.add({"gpu_uuid": "GPU-0"}, 17179869184)
    memory.add({"gpu_uuid": "GPU-1"}, 2.5e20)
    utilization = Family("nv_cpu_utilization", "CPU utilization rate\nsecond line", "gauge")
    utilization.add({}, 0.375)
    return [success, memory, utilization, Family("nv_energy_consumption", "none", "counter")]


def test_triton_text_has_bare_counters_sorted_labels_and_whole_numbers() -> None:
    text = render(_families())
    assert text.splitlines() == [
        "# HELP nv_inference_request_success Number of successful requests",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="odd\\"name\\\\",version="1"} 7',
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
        "# TYPE nv_gpu_memory_total_bytes gauge",
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-0"} 17179869184',
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-1"} 2.5e+20',
        "# HELP nv_cpu_utilization CPU utilization rate\\nsecond line",
        "# TYPE nv_cpu_utilization gauge",
        "nv_cpu_utilization 0.375",
    ]  # the family without samples is left out, as Triton leaves out what it does not have


def test_the_parsers_tools_use_read_the_triton_text() -> None:
    """prometheus_client's parser (Model Analyzer's) and perf_analyzer's expression."""
    text = render(_families())
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    assert parsed["nv_inference_request_success"].type == "counter"
    (sample,) = parsed["nv_inference_request_success"].samples
    assert (sample.labels["model"], sample.value) == ('odd"name\\', 7)
    assert [s.value for s in parsed["nv_gpu_memory_total_bytes"].samples] == [17179869184, 2.5e20]
    pattern = PERF_ANALYZER_GPU.format(name="nv_gpu_memory_total_bytes")
    assert re.findall(pattern, text)[0] == ("GPU-0", "17179869184")
    # what prometheus_client would have written for 16 GiB, and perf_analyzer read as 1 byte
    family = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory", labels=["gpu_uuid"])
    family.add_metric(["GPU-0"], 17179869184)
    registry = CollectorRegistry()
    registry.register(_Fixed(family))
    assert re.findall(pattern, generate_latest(registry).decode()) == [("GPU-0", "1.7179869184")]


def test_openmetrics_body_ends_with_eof_and_types_tritons_counters_unknown() -> None:
    registry = CollectorRegistry()
    Counter("batchserve_things", "Things.", registry=registry).inc(3)
    body, headers = metrics_body(registry, _families, OPENMETRICS, "")
    text = body.decode()
    assert dict(headers)["Content-Type"].startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    assert text.count("# EOF") == 1
    assert "# TYPE nv_inference_request_success unknown\n" in text
    assert "# TYPE nv_gpu_memory_total_bytes gauge\n" in text
    parsed = {family.name: family for family in openmetrics_families(text)}
    assert parsed["batchserve_things"].samples[0].value == 3
    (sample,) = parsed["nv_inference_request_success"].samples
    assert (sample.name, sample.value) == ("nv_inference_request_success", 7)


def test_text_body_appends_triton_families_and_gzips_when_asked() -> None:
    registry = CollectorRegistry()
    Counter("batchserve_things", "Things.", registry=registry).inc()
    plain, headers = metrics_body(registry, _families, "", "")
    assert dict(headers)["Content-Type"].startswith("text/plain; version=0.0.4")
    assert plain.decode().index("batchserve_things_total 1.0") < plain.decode().index("nv_")
    zipped, headers = metrics_body(registry, _families, "", "gzip, deflate")
    assert dict(headers)["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped) == plain


def test_a_name_filter_applies_to_tritons_families_too() -> None:
    registry = CollectorRegistry()
    Counter("batchserve_things", "Things.", registry=registry).inc()
    body, _ = metrics_body(registry, _families, "", "", ["nv_cpu_utilization"])
    assert [line for line in body.decode().splitlines() if not line.startswith("#")] == [
        "nv_cpu_utilization 0.375"
    ]
