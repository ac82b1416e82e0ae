"""An ensemble's steps as OpenTelemetry spans, built from Triton's trace records of them.

Both trace modes trace a step alike (``trace_records.StepTrace``), and with ``--workers`` the
steps come back from the model-owning process as those records, so the spans are built from
records in either case: one span per step, named after its model as Triton names its model
spans, under its parent step's span (a nested ensemble's steps) or else under the request's
``infer``; under it ``queue`` and ``compute`` where the step had them (an ensemble step has
neither); its timestamps as Triton's events (``span_events.py``). A step's tensors are
not traced here (the request's own are the root span's attributes at level TENSORS).

The OpenTelemetry API is imported when spans are built, as ``tracing.py`` imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from batchserve.observability.span_events import COMPUTE_EVENTS, MODEL_EVENTS, add_events
from batchserve.observability.trace_files import Record

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Tracer


@dataclass
class _Step:
    """One step's records gathered: its head and its timestamps by name."""

    head: Record = field(default_factory=dict)
    stamps: dict[str, int] = field(default_factory=dict)

    def attributes(self) -> dict[str, Any]:
        head = self.head
        version = head.get("model_version", -1)
        attributes: dict[str, Any] = {
            "model_name": head.get("model_name", ""),
            "model_version": str(version) if version != -1 else "",
        }
        if head.get("request_id"):
            attributes["request_id"] = head["request_id"]
        return attributes


def step_spans(tracer: Tracer, infer: Context, records: Iterable[Record], wall: int) -> None:
    """A span for each step ``records`` describe (``wall``: monotonic to wall-clock ns), in
    the order they started, so that a parent's span exists before its children's."""
    from opentelemetry.trace import set_span_in_context

    steps = _gathered(records)
    contexts: dict[int, Context] = {}
    for number in sorted(steps):
        step = steps[number]
        stamps = step.stamps
        if "REQUEST_START" not in stamps:
            continue  # (written without timestamps: nothing to place it in time)
        within = contexts.get(step.head.get("parent_id", -1), infer)
        span = tracer.start_span(
            str(step.head.get("model_name", "step")), context=within,
            attributes=step.attributes(), start_time=stamps["REQUEST_START"] + wall,
        )  # fmt: skip
        add_events(span, stamps.items(), MODEL_EVENTS, wall)
        contexts[number] = set_span_in_context(span)
        _phase(tracer, contexts[number], "queue", stamps, "QUEUE_START",
               ("COMPUTE_START", "REQUEST_END"), wall)  # fmt: skip
        _phase(tracer, contexts[number], "compute", stamps, "COMPUTE_START",
               ("COMPUTE_END", "REQUEST_END"), wall, COMPUTE_EVENTS)  # fmt: skip
        span.end(end_time=stamps.get("REQUEST_END", max(stamps.values())) + wall)


def _phase(
    tracer: Tracer, within: Context, name: str, stamps: dict[str, int], begins: str,
    ends: tuple[str, ...], wall: int, events: frozenset[str] = frozenset(),
) -> None:  # fmt: skip
    """A child span from stamp ``begins`` to the first of ``ends`` the step has, with the
    stamps among ``events`` as its events."""
    if begins not in stamps:
        return
    end = next((stamps[stamp] for stamp in ends if stamp in stamps), stamps[begins])
    span = tracer.start_span(name, context=within, start_time=stamps[begins] + wall)
    add_events(span, stamps.items(), events, wall)
    span.end(end_time=end + wall)


def _gathered(records: Iterable[Record]) -> dict[int, _Step]:
    """The records by step (trace id), as ``trace_summary.py`` groups them."""
    steps: dict[int, _Step] = {}
    for record in records:
        step = steps.setdefault(int(record["id"]), _Step())
        if "model_name" in record:
            step.head = record
        for stamp in record.get("timestamps", ()):
            step.stamps[stamp["name"]] = stamp["ns"]
    return steps
