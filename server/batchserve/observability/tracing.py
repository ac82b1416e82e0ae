"""OpenTelemetry spans for the inference requests the trace settings sample.

A traced request's trace, under its caller's W3C ``traceparent`` (and ``tracestate``)
when it sent one:

    InferRequest            the whole request, model_name / model_version / request_id
      receive               HTTP: reading (and inflating) the body
      decode                the wire format to arrays
      infer                 the server's work; in a worker, the hand-off round trip
        queue               waiting in the model's batcher (enqueued -> dispatched)
        compute             the batch the request ran in (dispatched -> answered)
      encode                the response to the wire format (and deflating it)
      send                  HTTP: writing the response

The request path only marks phase boundaries (a clock read each) while a request is traced;
the spans are built when it ends, with explicit start and end times, and leave through the
SDK's batch span processor, whose thread exports them over OTLP/HTTP: a slow or absent
receiver costs the requests nothing (spans past its queue are dropped). The queue and
compute spans come from the batcher's own timestamps on the work item, so the scheduler
knows nothing of tracing.

While tracing is off, the adapters check ``RequestTracer.on`` and nothing else, and no part
of the OpenTelemetry SDK is imported: it is imported when the first request is traced.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

from batchserve.core.trace_config import TraceConfig, parse_trace_config
from batchserve.observability.trace_settings import TraceSettings

if TYPE_CHECKING:
    from asyncio import Future

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from batchserve.core.types import InferResponse, Tensor

Header = Callable[[str], str | None]
"""A request's header (HTTP) or metadata (gRPC) value by lower-case name."""
SHUTDOWN_TIMEOUT_S = 2.0
"""How long exit waits for the last spans to leave: an absent receiver must not hold it."""
SERVICE_NAME = "batchserve"


class QueuedWork(Protocol):
    """What a request's spans read from the batcher's work item (``scheduler/work.py``)."""

    batch_size: int
    executed_batch_size: int
    priority: int
    enqueued_ns: int
    dispatched_ns: int
    future: Future[Any]


_current: ContextVar[RequestTrace | None] = ContextVar("batchserve_request_trace", default=None)


def current() -> RequestTrace | None:
    """The traced request this task serves, if any (set by ``RequestTracer.begin``)."""
    return _current.get()


class RequestTracer:
    """One per process: samples requests by the trace settings and builds their spans."""

    def __init__(self, settings: TraceSettings, config: TraceConfig | None = None) -> None:
        self.settings = settings
        self.config = config or TraceConfig()
        self._tracer: Tracer | None = None

    @classmethod
    def configured(cls, entries: Iterable[str]) -> RequestTracer:
        """A tracer with its own settings, started as ``--trace-config`` says (a worker's)."""
        config = parse_trace_config(tuple(entries))
        return cls(TraceSettings(config), config)

    @property
    def on(self) -> bool:
        """Whether any request may be traced: the only check while tracing is off."""
        return self.settings.enabled

    def begin(self, protocol: str, model: str, header: Header) -> RequestTrace | None:
        """Decide whether this request is traced; when it is, its trace becomes current."""
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
        levels = self.settings.sample(model, propagated)
        if levels is None:
            return None
        trace = RequestTrace(self._otel(), parent, protocol, model, "TENSORS" in levels)
        trace.token = _current.set(trace)
        return trace

    def watch(self, item: QueuedWork) -> None:
        """The current traced request's work item: its queue and compute spans are taken
        from the batcher's timestamps once it is answered."""
        trace = _current.get()
        if trace is not None:
            trace.item = item
            item.future.add_done_callback(lambda future: trace.executed(item, future))

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


class RequestTrace:
    """One traced request: phase boundaries on the monotonic clock, turned into spans
    (on the wall clock, which OpenTelemetry wants) when the request ends."""

    def __init__(
        self, tracer: Tracer, parent: Context | None, protocol: str, model: str, tensors: bool
    ) -> None:
        self.tracer = tracer
        self.parent = parent
        self.tensors = tensors
        self.token: Token[RequestTrace | None] | None = None
        self.offset = time.time_ns() - time.monotonic_ns()
        self.start = self.last = time.monotonic_ns()
        self.phases: list[tuple[str, int, int]] = []
        self.attributes: dict[str, Any] = {"model_name": model, "protocol": protocol}
        self.item: QueuedWork | None = None
        self.batch: tuple[int, int, int, dict[str, Any]] | None = None
        self.error: str | None = None

    def mark(self, phase: str) -> None:
        """``phase`` ended now; it began where the previous one ended."""
        now = time.monotonic_ns()
        self.phases.append((phase, self.last, now))
        self.last = now

    def failed(self, error: BaseException) -> None:
        from batchserve.core.errors import public_message

        self.error = f"{type(error).__name__}: {public_message(error)}"

    def answered(self, response: InferResponse) -> None:
        """The served model version, request id, and output tensors at level TENSORS."""
        self.attributes["model_version"] = response.model_version
        self.attributes["request_id"] = response.id
        if self.tensors:
            self.attributes.update(_tensor_attributes("output", response.outputs))

    def decoded(self, inputs: Iterable[Tensor]) -> None:
        if self.tensors:
            self.attributes.update(_tensor_attributes("input", inputs))

    def executed(self, item: QueuedWork, future: Future[Any], now: int = 0) -> None:
        """The batcher answered the request's work item: queue from its enqueue time to its
        dispatch (or to now, when it never ran), compute from dispatch to now."""
        now = now or time.monotonic_ns()
        ok = not future.cancelled() and future.exception() is None
        self.ran(*batch_times(item, now, ok))

    def ran(
        self, enqueued: int, dispatched: int, answered: int, attributes: dict[str, Any]
    ) -> None:
        """The batch times of ``executed``, as the model-owning process sends a worker them
        (the monotonic clock is the machine's, the same in both processes)."""
        self.batch = (enqueued, dispatched, answered, attributes)

    def finish(self) -> None:
        """Build and end every span; the request's trace stops being current."""
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        end = time.monotonic_ns()
        if self.token is not None:
            _current.reset(self.token)
            self.token = None
        wall = self.offset
        root = self.tracer.start_span(
            "InferRequest", context=self.parent, kind=SpanKind.SERVER,
            attributes=self.attributes, start_time=self.start + wall,
        )  # fmt: skip
        if self.error is not None:
            root.set_status(Status(StatusCode.ERROR, self.error))
        within = set_span_in_context(root)
        if self.batch is None and self.item is not None and self.item.future.done():
            # Answered within the request's own step: its callback has not run yet.
            answered = next((end for phase, _, end in self.phases if phase == "infer"), 0)
            self.executed(self.item, self.item.future, answered)
        for phase, start, end in self.phases:
            span = self.tracer.start_span(phase, context=within, start_time=start + wall)
            if phase == "infer" and self.batch is not None:
                self._batch_spans(set_span_in_context(span))
            span.end(end_time=end + wall)
        root.end(end_time=end + wall)

    def _batch_spans(self, within: Context) -> None:
        from opentelemetry.trace import Status, StatusCode

        assert self.batch is not None
        enqueued, dispatched, answered, attributes = self.batch
        wall = self.offset
        queue = self.tracer.start_span("queue", context=within, start_time=enqueued + wall)
        queue.end(end_time=dispatched + wall)
        compute = self.tracer.start_span(
            "compute", context=within, attributes=attributes, start_time=dispatched + wall
        )
        if not answered:
            compute.set_status(Status(StatusCode.ERROR, "the batch failed or never ran"))
        compute.end(end_time=(answered or dispatched) + wall)


def batch_times(item: QueuedWork, now: int, ok: bool) -> tuple[int, int, int, dict[str, Any]]:
    """What ``RequestTrace.ran`` takes of a work item answered ``now``: queued from its
    enqueue time to its dispatch (or to now, when it never ran), computed from dispatch to
    now (0: it failed), and the batch's attributes."""
    attributes = {
        "request_batch_size": item.batch_size,
        "batch_size": item.executed_batch_size,
        "priority": item.priority,
    }
    return item.enqueued_ns, item.dispatched_ns or now, now if ok else 0, attributes


def _tensor_attributes(role: str, tensors: Iterable[Tensor]) -> dict[str, str]:
    """TENSORS level: each tensor's datatype and shape (its data stays out of traces)."""
    attributes: dict[str, str] = {}
    for tensor in tensors:
        attributes[f"{role}.{tensor.name}.datatype"] = tensor.datatype.wire
        attributes[f"{role}.{tensor.name}.shape"] = ",".join(str(d) for d in tensor.shape)
    return attributes
