"""The traces of sampled inference requests, in the mode ``--trace-config`` chose.

``opentelemetry``: OpenTelemetry spans, under the caller's W3C ``traceparent`` (and
``tracestate``) when it sent one:

    InferRequest            the whole request, model_name / model_version / request_id
      receive               HTTP: reading (and inflating) the body
      decode                the wire format to arrays
      infer                 the server's work; in a worker, the hand-off round trip
        queue               waiting in the model's batcher (enqueued -> dispatched)
        compute             the batch the request ran in (dispatched -> answered)
        <step model>        an ensemble's, instead: each step (``step_spans.py``)
      encode                the response to the wire format (and deflating it)
      send                  HTTP: writing the response

built with explicit start and end times when the request ends, and sent by the SDK's batch
span processor from its own thread over OTLP/HTTP: a slow or absent receiver costs the
requests nothing (spans past its queue are dropped).

``triton``: Triton's JSON trace files (``trace_records.py``, ``trace_files.py``).

While tracing is off, the adapters check ``RequestTracer.on`` and nothing else, and no part
of the OpenTelemetry SDK is imported: it is imported when the first span is built.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from batchserve.core.trace_config import TRITON, TraceConfig, parse_trace_config
from batchserve.observability.request_trace import QueuedWork, RequestTrace, current
from batchserve.observability.span_events import (
    COMPUTE_EVENTS,
    MODEL_EVENTS,
    ROOT_EVENTS,
    add_events,
)
from batchserve.observability.step_spans import step_spans
from batchserve.observability.trace_files import Sink, TraceFiles
from batchserve.observability.trace_records import FORWARDED_ROOT, FileTrace, SteppedTrace
from batchserve.observability.trace_settings import TraceSettings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from batchserve.core.types import Tensor

Header = Callable[[str], str | None]
"""A request's header (HTTP) or metadata (gRPC) value by lower-case name."""
SHUTDOWN_TIMEOUT_S = 2.0
"""How long exit waits for the last spans to leave: an absent receiver must not hold it."""
SERVICE_NAME = "batchserve"


class RequestTracer:
    """One per process: samples requests by the trace settings and writes their traces.

    ``sink``: where a worker's trace-file traces go (a frame to the model-owning process);
    without one, this process writes the trace file itself."""

    def __init__(
        self, settings: TraceSettings, config: TraceConfig | None = None, sink: Sink | None = None
    ) -> None:
        self.settings = settings
        self.config = config or TraceConfig()
        self._tracer: Tracer | None = None
        self.files: TraceFiles | None = None
        self._sink = sink
        self._ids: Callable[[], int] = itertools.count(1).__next__
        if self.config.mode == TRITON and sink is None:
            self.files = TraceFiles(self.config.file)
            self._sink, self._ids = self.files.collect, self.files.next_id
            settings.on_counted(self.files.counted)
            settings.on_reset(self.files.reset)

    @classmethod
    def configured(cls, entries: Iterable[str], sink: Sink | None = None) -> RequestTracer:
        """A tracer with its own settings, started as ``--trace-config`` says (a worker's)."""
        config = parse_trace_config(tuple(entries))
        return cls(TraceSettings(config), config, sink)

    @property
    def on(self) -> bool:
        """Whether any request may be traced: the only check while tracing is off."""
        return self.settings.enabled

    def begin(self, protocol: str, model: str, header: Header) -> RequestTrace | None:
        """Decide whether this request is traced; when it is, its trace becomes current."""
        trace: RequestTrace
        if self.settings.mode == TRITON:
            sample = self.settings.sample(model, False)
            if sample is None or self._sink is None:
                return None
            trace = FileTrace(protocol, model, sample, self._ids, self._sink)
        else:
            span_trace = self._span_trace(protocol, model, header)
            if span_trace is None:
                return None
            trace = span_trace
        trace.enter()
        return trace

    def _span_trace(self, protocol: str, model: str, header: Header) -> SpanTrace | None:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {
            name: value
            for name in ("traceparent", "tracestate")
            if (value := header(name)) is not None
        }
        parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
        caller = get_current_span(parent).get_span_context() if parent is not None else None
        propagated = caller is not None and caller.is_valid and caller.trace_flags.sampled
        sample = self.settings.sample(model, propagated)
        if sample is None:
            return None
        return SpanTrace(self._otel(), parent, protocol, model, "TENSORS" in sample.levels)

    def watch(self, item: QueuedWork) -> None:
        """The current traced request's work item: its queue and compute times are taken
        from the batcher's timestamps once it is answered."""
        trace = current()
        if trace is not None:
            trace.watch(item)

    def close(self) -> None:
        """Write what the trace file has collected (the server stops)."""
        if self.files is not None:
            self.files.close()

    def _otel(self) -> Tracer:
        if self._tracer is None:
            self._tracer = _tracer(self.config)
        return self._tracer


def _tracer(config: TraceConfig) -> Tracer:
    """The SDK set up once: OTLP/HTTP to ``url`` (else the standard ``OTEL_EXPORTER_OTLP_*``
    variables, else Triton's default localhost:4318), in batches."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name" in config.resource
    attributes = {**({} if named else {"service.name": SERVICE_NAME}), **config.resource}
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=config.url),
        max_queue_size=config.batch.get("bsp_max_queue_size"),
        schedule_delay_millis=config.batch.get("bsp_schedule_delay"),
        max_export_batch_size=config.batch.get("bsp_max_export_batch_size"),
    )
    # The settings sampled the request already: every span of a traced request is kept.
    provider = TracerProvider(
        sampler=ALWAYS_ON, resource=Resource.create(attributes), shutdown_on_exit=False
    )
    provider.add_span_processor(processor)
    atexit.register(_shut_down, provider)
    return provider.get_tracer("batchserve")


def _shut_down(provider: TracerProvider) -> None:
    """Send the last spans at exit, waiting at most ``SHUTDOWN_TIMEOUT_S``: the exporter
    retries an absent receiver for longer, and the server must not wait on it."""
    sending = threading.Thread(target=provider.shutdown, name="trace-shutdown", daemon=True)
    sending.start()
    sending.join(SHUTDOWN_TIMEOUT_S)


class SpanTrace(SteppedTrace):
    """A traced request written as OpenTelemetry spans (on the wall clock, which
    OpenTelemetry wants) when it ends; an ensemble's steps are spans under ``infer``."""

    def __init__(
        self, tracer: Tracer, parent: Context | None, protocol: str, model: str, tensors: bool
    ) -> None:
        # its steps' tensors stay out: their spans would take only datatypes and shapes, and
        # the records format every value
        super().__init__(protocol, model, tensors, timestamps=True, step_tensors=False)
        self.tracer = tracer
        self.parent = parent
        self.offset = time.time_ns() - time.monotonic_ns()
        self.id = FORWARDED_ROOT  # its steps' parent, as the forwarded steps name it
        self.ids = itertools.count(1).__next__

    def finish(self) -> None:
        """Build and end every span; the request's trace stops being current."""
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        end = time.monotonic_ns()
        self.leave()
        self.settle_batch()
        wall, timeline = self.offset, self.timeline()
        root = self.tracer.start_span(
            "InferRequest", context=self.parent, kind=SpanKind.SERVER,
            attributes=self._attributes(), start_time=self.start + wall,
        )  # fmt: skip
        if self.error is not None:
            root.set_status(Status(StatusCode.ERROR, self.error))
        add_events(root, timeline, ROOT_EVENTS, wall)
        within = set_span_in_context(root)
        for phase, start, end_ns in self.phases:
            span = self.tracer.start_span(phase, context=within, start_time=start + wall)
            if phase == "infer":
                add_events(span, timeline, MODEL_EVENTS, wall)
                infer = set_span_in_context(span)
                if self.batch is not None and not self.composite:
                    self._batch_spans(infer, timeline)
                step_spans(self.tracer, infer, self.step_records(self.request_id), wall)
            span.end(end_time=end_ns + wall)
        root.end(end_time=end + wall)

    def _attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {"model_name": self.model, "protocol": self.protocol}
        if self.response is not None:
            attributes["model_version"] = self.response.model_version
            attributes["request_id"] = self.response.id
        if self.tensors:
            attributes.update(_tensor_attributes("input", self.inputs))
            if self.response is not None:
                attributes.update(_tensor_attributes("output", self.response.outputs))
        return attributes

    def _batch_spans(self, within: Context, timeline: list[tuple[str, int]]) -> None:
        from opentelemetry.trace import Status, StatusCode

        assert self.batch is not None
        enqueued, dispatched, answered, attributes, _ = self.batch
        wall = self.offset
        queue = self.tracer.start_span("queue", context=within, start_time=enqueued + wall)
        queue.end(end_time=dispatched + wall)
        compute = self.tracer.start_span(
            "compute", context=within, attributes=attributes, start_time=dispatched + wall
        )
        if not answered:
            compute.set_status(Status(StatusCode.ERROR, "the batch failed or never ran"))
        add_events(compute, timeline, COMPUTE_EVENTS, wall)
        compute.end(end_time=(answered or dispatched) + wall)


def _tensor_attributes(role: str, tensors: Iterable[Tensor]) -> dict[str, str]:
    """TENSORS level: each tensor's datatype and shape (its data stays out of traces)."""
    attributes: dict[str, str] = {}
    for tensor in tensors:
        attributes[f"{role}.{tensor.name}.datatype"] = tensor.datatype.wire
        attributes[f"{role}.{tensor.name}.shape"] = ",".join(str(d) for d in tensor.shape)
    return attributes
