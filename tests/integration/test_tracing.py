"""OpenTelemetry tracing end to end: a real server exports its spans over OTLP/HTTP to a
real OTLP receiver started here, driven by Triton's trace settings through tritonclient.

No OpenTelemetry Collector or Jaeger installs from the package registries this project
uses, so the receiver is a small OTLP/HTTP endpoint: it parses each export with
``opentelemetry-proto``'s generated ``ExportTraceServiceRequest``, as a collector does.
"""

from __future__ import annotations

import queue
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.ensemble_models import (
    ENSEMBLE,
    NESTED,
    NESTED_CONFIG,
    ROW,
    write_ensemble,
    write_pipeline_repository,
)
from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "digits_cnn"
HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
COMPUTE_EVENTS = {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, object]
    error: bool
    events: frozenset[str] = frozenset()


class Receiver:
    """POST /v1/traces, as an OpenTelemetry Collector's OTLP/HTTP receiver takes it."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, export: ExportTraceServiceRequest) -> None:
        spans = [
            Span(
                span.name,
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                {a.key: _value(a.value) for a in span.attributes},
                span.status.code == 2,
                frozenset(event.name for event in span.events),
            )
            for resource in export.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.lock:
            self.spans.extend(spans)

    def traces(self, request_id: str, wait: float = 10.0, spans: int = 6) -> list[list[Span]]:
        """The traces whose root carries ``request_id``, once the server exported at least
        ``spans`` spans of each (or ``wait`` seconds passed)."""
        deadline = time.monotonic() + wait
        while True:
            with self.lock:
                roots = [s for s in self.spans if s.name == "InferRequest"
                         and s.attributes.get("request_id") == request_id]  # fmt: skip
                traces = [[s for s in self.spans if s.trace_id == r.trace_id] for r in roots]
            complete = traces and all(len(t) >= spans for t in traces)
            if complete or time.monotonic() > deadline:
                return traces
            time.sleep(0.05)


def _value(value: object) -> object:
    which = value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(value, which) if which else None


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiving = Receiver()
    yield receiving
    receiving.server.shutdown()
    receiving.server.server_close()


def _traced_server(repo: Path, url: str, *extra: str) -> ServerProcess:
    shutil.copytree(MODEL_REPO / MODEL, repo / MODEL, dirs_exist_ok=True)
    args = [
        "--model-control-mode", "explicit", "--load-model", MODEL,
        "--trace-config", f"opentelemetry,url={url}",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50", *extra,
    ]  # fmt: skip
    return start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[ServerProcess]:
    started = _traced_server(tmp_path_factory.mktemp("traced"), receiver.url)
    yield started
    assert started.stop() == 0


Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    """A client of the shared server, whose trace settings go back to the defaults after."""
    if request.param == "http":
        chosen: Client = httpclient.InferenceServerClient(server.http_url)
    else:
        chosen = grpcclient.InferenceServerClient(server.grpc_url)
    yield chosen
    _settings(chosen, trace_level=None, trace_rate=None, trace_count=None)


def _settings(client: Client, **settings: object) -> dict[str, object]:
    if isinstance(client, httpclient.InferenceServerClient):
        return dict(client.update_trace_settings("", settings, headers=HEADERS))
    answer = client.update_trace_settings("", settings, headers=HEADERS, as_json=True)
    return {k: v["value"] for k, v in answer["settings"].items()}


def _infer(client: Client, request_id: str, headers: dict[str, str] | None = None) -> None:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("image", [2, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 1, 8, 8), dtype=np.float32))
    result = client.infer(MODEL, [tensor], request_id=request_id, headers=headers)
    assert result.as_numpy("probabilities").shape == (2, 10)


def _named(trace: list[Span]) -> dict[str, Span]:
    return {span.name: span for span in trace}


def _protocol(client: Client) -> str:
    return "http" if isinstance(client, httpclient.InferenceServerClient) else "grpc"


def _count(client: Client) -> str:
    if isinstance(client, httpclient.InferenceServerClient):
        return str(client.get_trace_settings()["trace_count"])
    return str(client.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"][0])


def test_a_traced_request_has_one_trace_with_every_phase(
    client: Client, receiver: Receiver
) -> None:
    protocol = _protocol(client)
    answer = _settings(client, trace_level=["TIMESTAMPS"], trace_rate="1")
    assert answer["trace_level"] == ["TIMESTAMPS"]
    assert answer["trace_mode"] in ("opentelemetry", ["opentelemetry"])
    _infer(client, f"phases-{protocol}")
    (trace,) = receiver.traces(f"phases-{protocol}")
    spans = _named(trace)
    expected = {"InferRequest", "decode", "infer", "queue", "compute", "encode"}
    expected |= {"receive", "send"} if protocol == "http" else set()
    assert set(spans) == expected
    root = spans["InferRequest"]
    assert root.parent_id == ""  # no caller context: the trace starts here
    assert root.attributes["model_name"] == MODEL
    assert root.attributes["model_version"] == "1"
    assert root.attributes["protocol"] == protocol
    for phase in expected - {"InferRequest", "queue", "compute"}:
        assert spans[phase].parent_id == root.span_id
        assert root.start <= spans[phase].start <= spans[phase].end <= root.end
    infer = spans["infer"]
    queue, compute = spans["queue"], spans["compute"]
    assert queue.parent_id == compute.parent_id == infer.span_id
    assert infer.start <= queue.start <= queue.end == compute.start <= compute.end <= infer.end
    assert compute.attributes["request_batch_size"] == 2
    assert compute.attributes["batch_size"] >= 2  # the whole batch it ran in
    # Triton's timestamps as events, on the spans Triton's model and compute spans match
    side = protocol.upper()
    ends = {f"{side}_RECV_START", f"{side}_RECV_END", f"{side}_SEND_START", f"{side}_SEND_END"}
    if protocol == "grpc":  # read and sent by grpc outside the handler
        ends = {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START"}
    assert root.events == ends | {"INFER_RESPONSE_COMPLETE"}
    assert infer.events == {"REQUEST_START", "QUEUE_START", "REQUEST_END"}
    assert compute.events == COMPUTE_EVENTS
    assert not queue.events
    assert spans["decode"].end <= infer.start
    assert infer.end <= spans["encode"].start


def test_a_stream_s_requests_are_traced_each_under_the_stream_s_context(
    server: ServerProcess, receiver: Receiver
) -> None:
    """``ModelStreamInfer``: each request its own trace, with the phases of a unary call,
    continuing the caller's trace sent as the stream's metadata."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    try:
        _settings(client, trace_level=["TIMESTAMPS"], trace_rate="1")
        traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        client.start_stream(
            callback=lambda result, error: answers.put(error or result),
            headers={"traceparent": traceparent},
        )
        for n in range(2):
            tensor = grpcclient.InferInput("image", [2, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(np.zeros((2, 1, 8, 8), dtype=np.float32))
            client.async_stream_infer(MODEL, [tensor], request_id=f"stream-{n}")
        for _ in range(2):
            assert not isinstance(answers.get(timeout=30), Exception)
        client.stop_stream()
        for n in range(2):
            (trace,) = receiver.traces(f"stream-{n}")
            spans = _named(trace)
            assert set(spans) == {"InferRequest", "decode", "infer", "queue", "compute", "encode"}
            assert spans["InferRequest"].trace_id == CALLER_TRACE
    finally:
        _settings(client, trace_level=None, trace_rate=None)
        client.close()


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_requests_are_traced_as_http_inferences(
    server: ServerProcess, receiver: Receiver, endpoint: str
) -> None:
    """Triton's generate extension: the phases of an HTTP inference request, continuing the
    caller's trace from its ``traceparent`` header."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        _settings(client, trace_level=["TIMESTAMPS"], trace_rate="1")
        try:
            traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
            answer = httpx.post(
                f"http://{server.http_url}/v2/models/{MODEL}/{endpoint}",
                json={"id": endpoint, "image": [0.0] * 64},
                headers={"traceparent": traceparent},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert "probabilities" in answer.text
            (trace,) = receiver.traces(endpoint)
        finally:
            _settings(client, trace_level=None, trace_rate=None)
    spans = _named(trace)
    phases = {"receive", "decode", "infer", "encode", "send"}
    assert set(spans) == {"InferRequest", "queue", "compute", *phases}
    root = spans["InferRequest"]
    assert root.trace_id == CALLER_TRACE
    assert root.parent_id == CALLER_SPAN
    assert root.attributes["protocol"] == "http"
    ends = [spans[phase].end for phase in ("receive", "decode", "infer", "encode", "send")]
    assert ends == sorted(ends)
    assert spans["send"].end <= root.end


def test_the_caller_s_trace_continues_from_traceparent(client: Client, receiver: Receiver) -> None:
    """Metadata for gRPC, a header for HTTP; traced whatever the rate says, as Triton does."""
    protocol = _protocol(client)
    _settings(client, trace_level=["TIMESTAMPS"], trace_rate="0")
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    _infer(client, f"caller-{protocol}", {"traceparent": traceparent, "tracestate": "k=v"})
    (trace,) = receiver.traces(f"caller-{protocol}")
    root = _named(trace)["InferRequest"]
    assert root.trace_id == CALLER_TRACE
    assert root.parent_id == CALLER_SPAN


def test_rate_samples_and_count_stops(client: Client, receiver: Receiver) -> None:
    protocol = _protocol(client)
    _settings(client, trace_level=["TIMESTAMPS"], trace_rate="2", trace_count="-1")
    for index in range(4):
        _infer(client, f"rate-{protocol}-{index}")
    assert receiver.traces(f"rate-{protocol}-3")  # every 2nd request: the 2nd and the 4th
    assert receiver.traces(f"rate-{protocol}-1")
    assert not receiver.traces(f"rate-{protocol}-0", wait=0) + receiver.traces(
        f"rate-{protocol}-2", wait=0
    )
    _settings(client, trace_rate="1", trace_count="2")
    for index in range(4):
        _infer(client, f"count-{protocol}-{index}")
    assert receiver.traces(f"count-{protocol}-0")
    assert receiver.traces(f"count-{protocol}-1")
    time.sleep(0.5)  # two batch delays: a third trace would have arrived
    assert not receiver.traces(f"count-{protocol}-2", wait=0) + receiver.traces(
        f"count-{protocol}-3", wait=0
    )
    assert _count(client) == "0"  # the traces still to take, as Triton answers it


def test_no_spans_while_tracing_is_off(client: Client, receiver: Receiver) -> None:
    protocol = _protocol(client)
    _settings(client, trace_level=["OFF"], trace_rate="1")
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    _infer(client, f"off-{protocol}", {"traceparent": traceparent})
    assert receiver.traces(f"off-{protocol}", wait=1.0) == []


def test_an_unreachable_receiver_does_not_slow_requests(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    server = _traced_server(
        tmp_path, f"127.0.0.1:{closed}/v1/traces", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1",
    )  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        _infer(client, "warm")
        started = time.monotonic()
        for index in range(20):
            _infer(client, f"unreachable-{index}")
        assert time.monotonic() - started < 5.0
    finally:
        stopping = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - stopping < 15.0


def test_workers_take_the_trace_count_together(tmp_path: Path, receiver: Receiver) -> None:
    """``trace_count`` is the number of traces the server takes, whichever worker serves the
    requests, and the count a client reads goes down to 0 as Triton's does."""
    server = _traced_server(tmp_path, receiver.url, "--workers", "2")
    try:
        control = httpclient.InferenceServerClient(server.http_url)
        _settings(control, trace_level=["TIMESTAMPS"], trace_rate="1", trace_count="3")
        for index in range(8):
            module = (httpclient, grpcclient)[index % 2]
            url = (server.http_url, server.grpc_url)[index % 2]
            client = module.InferenceServerClient(url)  # a new connection: either worker
            _infer(client, f"together-{index}")
            client.close()
        assert _count(control) == "0"
        time.sleep(0.5)  # ten batch delays: every trace taken has arrived
        traced = [i for i in range(8) if receiver.traces(f"together-{i}", wait=0)]
        assert traced == [0, 1, 2]
    finally:
        assert server.stop() == 0


def test_workers_trace_their_requests_by_the_server_s_settings(
    tmp_path: Path, receiver: Receiver
) -> None:
    """With --workers, a worker decodes and encodes, and the model-owning process runs the
    batch: the worker's spans carry the caller's trace; its infer span is the hand-off, with
    the queue and compute spans of the batch there as its children, as in one process."""
    server = _traced_server(tmp_path, receiver.url, "--workers", "2")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        _infer(client, "worker-off", {"traceparent": traceparent})
        assert receiver.traces("worker-off", wait=1.0) == []  # off by default, there too
        _settings(client, trace_level=["TIMESTAMPS"], trace_rate="1")
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for index in range(4):  # both workers: each follows the settings set through one
            _infer(client, f"worker-http-{index}", {"traceparent": traceparent})
            _infer(grpc, f"worker-grpc-{index}")
        for index in range(4):
            (trace,) = receiver.traces(f"worker-http-{index}", spans=8)
            spans = _named(trace)
            assert {"receive", "decode", "infer", "queue", "compute", "encode", "send"} <= set(
                spans
            )
            assert spans["InferRequest"].trace_id == CALLER_TRACE
            (trace,) = receiver.traces(f"worker-grpc-{index}")
            spans = _named(trace)
            assert set(spans) == {"InferRequest", "decode", "infer", "queue", "compute", "encode"}
            infer = spans["infer"]
            for child in (spans["queue"], spans["compute"]):
                assert child.parent_id == infer.span_id
                assert infer.start <= child.start <= child.end <= infer.end
            assert spans["queue"].end <= spans["compute"].start + 1
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "workers"])
def test_an_ensemble_s_steps_are_spans_under_its_infer(
    tmp_path: Path, receiver: Receiver, workers: str
) -> None:
    """As Triton's model spans: each step of an ensemble a span named after its model, under
    the request's ``infer`` (a nested ensemble's steps under that step's span), with the
    ``queue`` and ``compute`` of the batch it ran in; an ensemble has neither of its own.
    With workers the steps ran in the model-owning process and came back with the answer."""
    repo = write_pipeline_repository(tmp_path / "repo", delay_us=0)
    write_ensemble(repo, NESTED_CONFIG, NESTED)
    args = ["--workers", workers, "--trace-config", f"opentelemetry,url={receiver.url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=50",
            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]  # fmt: skip
    server = start_server(repo, args)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        x = np.arange(ROW, dtype=np.float32).reshape(1, ROW)
        tensor = httpclient.InferInput("X", [1, ROW], "FP32")
        tensor.set_data_from_numpy(x)
        answer = client.infer(NESTED, [tensor], request_id=f"steps-{workers}")
        np.testing.assert_array_equal(answer.as_numpy("Y"), 3 * x)
        client.close()
        (trace,) = receiver.traces(f"steps-{workers}", spans=13)
    finally:
        assert server.stop() == 0
    by_id = {span.span_id: span for span in trace}
    tree = sorted(
        (span.name, by_id[span.parent_id].name if span.parent_id in by_id else "") for span in trace
    )
    root = "InferRequest"
    assert tree == sorted([
        (root, ""), ("receive", root), ("decode", root), ("infer", root), ("encode", root),
        ("send", root), (ENSEMBLE, "infer"), ("doubler", ENSEMBLE), ("adder", ENSEMBLE),
        ("queue", "doubler"), ("compute", "doubler"), ("queue", "adder"), ("compute", "adder"),
    ])  # fmt: skip
    for span in trace:
        if span.parent_id in by_id:
            parent = by_id[span.parent_id]
            assert parent.start <= span.start <= span.end <= parent.end, (parent, span)
    (doubler,) = [span for span in trace if span.name == "doubler"]
    assert doubler.attributes == {
        "model_name": "doubler", "model_version": "1", "request_id": f"steps-{workers}",
    }  # fmt: skip
    events = {(span.name, by_id[span.parent_id].name): span.events for span in trace
              if span.name in ("infer", ENSEMBLE, "doubler", "compute")}  # fmt: skip
    assert events == {
        ("infer", root): {"REQUEST_START", "REQUEST_END"},  # an ensemble queues nothing
        (ENSEMBLE, "infer"): {"REQUEST_START", "REQUEST_END"},
        ("doubler", ENSEMBLE): {"REQUEST_START", "QUEUE_START", "REQUEST_END"},
        ("compute", "doubler"): COMPUTE_EVENTS, ("compute", "adder"): COMPUTE_EVENTS,
    }  # fmt: skip
