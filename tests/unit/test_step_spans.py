"""Ensemble steps as OpenTelemetry spans, from Triton's step records, built by the real
OpenTelemetry SDK into its in-memory exporter: the cases a served ensemble rarely shows (a
step that failed before its batch ran, records without timestamps, a step's parent that is
another step). The served path is tested end to end in tests/integration/test_tracing.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from batchserve.observability.step_spans import step_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

WALL = 1_000_000_000_000


def _head(number: int, model: str, parent: int, **extra: Any) -> dict[str, Any]:
    return {"id": number, "model_name": model, "model_version": 1, "parent_id": parent, **extra}


def _stamps(number: int, **stamps: int) -> list[dict[str, Any]]:
    return [{"id": number, "timestamps": [{"name": name, "ns": ns}]} for name, ns in stamps.items()]


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, Any]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider.get_tracer("test")
    provider.shutdown()


def _build(spans: tuple[InMemorySpanExporter, Any], records: list[dict[str, Any]]) -> dict:
    exporter, tracer = spans
    infer = tracer.start_span("infer", start_time=WALL)
    step_spans(tracer, set_span_in_context(infer), records, WALL)
    infer.end(end_time=WALL + 1000)
    return {span.name: span for span in exporter.get_finished_spans()}


def _parent(found: dict[str, ReadableSpan], name: str) -> str:
    parent = found[name].parent
    assert parent is not None
    return next(n for n, s in found.items() if s.context.span_id == parent.span_id)


def test_a_nested_step_is_under_its_step_and_a_failed_one_has_no_compute(spans: Any) -> None:
    """A nested ensemble's step under that step's span; a step that failed before its batch
    ran (queued, no compute stamps) has a queue span to its end, no compute; the events are
    Triton's on each; times on the wall clock."""
    records = [
        _head(2, "inner", 1, request_id="r"), *_stamps(2, REQUEST_START=10, REQUEST_END=90),
        _head(3, "doubler", 2, request_id="r"),
        *_stamps(3, REQUEST_START=20, QUEUE_START=21, COMPUTE_START=30, COMPUTE_INPUT_END=31,
                 COMPUTE_OUTPUT_START=40, COMPUTE_END=41, REQUEST_END=50),
        _head(4, "picker", 2), *_stamps(4, REQUEST_START=60, QUEUE_START=61, REQUEST_END=70),
    ]  # fmt: skip
    found = _build(spans, records)
    assert _parent(found, "inner") == "infer"
    assert _parent(found, "doubler") == "inner"
    assert _parent(found, "picker") == "inner"
    assert found["doubler"].attributes == {
        "model_name": "doubler", "model_version": "1", "request_id": "r"
    }  # fmt: skip
    assert (found["doubler"].start_time, found["doubler"].end_time) == (WALL + 20, WALL + 50)
    doubler_id = found["doubler"].context.span_id
    doubler = {s.name: s for s in spans[0].get_finished_spans()
               if s.parent is not None and s.parent.span_id == doubler_id}  # fmt: skip
    assert (doubler["queue"].start_time, doubler["queue"].end_time) == (WALL + 21, WALL + 30)
    assert (doubler["compute"].start_time, doubler["compute"].end_time) == (WALL + 30, WALL + 41)
    assert [e.name for e in doubler["compute"].events] == [
        "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
    ]  # fmt: skip
    picker_id = found["picker"].context.span_id
    picker = [s for s in spans[0].get_finished_spans()
              if s.parent is not None and s.parent.span_id == picker_id]  # fmt: skip
    assert [(s.name, s.start_time, s.end_time) for s in picker] == [
        ("queue", WALL + 61, WALL + 70)
    ]  # the queue until the step's end; no compute
    assert {e.name for e in found["doubler"].events} == {
        "REQUEST_START",
        "QUEUE_START",
        "REQUEST_END",
    }
    assert {e.name for e in found["inner"].events} == {"REQUEST_START", "REQUEST_END"}


def test_a_step_written_without_timestamps_gets_no_span(spans: Any) -> None:
    """Records at level TENSORS alone: nothing to place a span in time, so none."""
    tensor = {"name": "X", "data": "1", "shape": "1", "dtype": "FP32"}
    records = [
        _head(2, "doubler", 1),
        {"id": 2, "activity": "TENSOR_QUEUE_INPUT", "tensor": tensor},
    ]
    assert set(_build(spans, records)) == {"infer"}
