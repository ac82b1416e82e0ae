"""Faults seen from outside, over both protocols: clients that leave, a full queue, models
loaded and unloaded under traffic, and a model that cannot load next to ones that can."""

from __future__ import annotations

import json
import math
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.server import (
    CONTROL_TOKEN,
    MODEL_REPO,
    ServerProcess,
    metric,
    start_server,
)
from tests.integration.slow_model import WIDTH, expected, write_slow_model

QUEUE = 4
BLOCK_SECONDS = 5.0
"""How long the request holding the only instance runs: the time the test has to act."""
CALIBRATION_ITERATIONS = 30
LEAVE_AFTER = 1.0
"""Client timeout and gRPC deadline of the requests that give up while queued."""


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Poll ``condition`` (a state of the server, read from outside) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what or condition}")
        time.sleep(0.02)


def model_stats(server: ServerProcess, model: str) -> dict[str, int]:
    """The counters of the model's (only) served version, from the HTTP statistics route."""
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    row = httpx.get(url, timeout=10).json()["model_stats"][0]
    inference = row["inference_stats"]
    return {
        "execution_count": row["execution_count"],
        "success": inference["success"]["count"],
        "fail": inference["fail"]["count"],
    }


# the slow model ---------------------------------------------------------------------------
X = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)


def slow_body(iterations: int) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, WIDTH], "data": X.ravel().tolist()},
            {"name": "iterations", "datatype": "INT64", "shape": [1, 1], "data": [iterations]},
        ]
    }


def slow_grpc_request(iterations: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, WIDTH])
    request.inputs.add(name="iterations", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.extend([X.tobytes(), np.array([[iterations]], np.int64).tobytes()])
    return request


def slow_http(server: ServerProcess, iterations: int, timeout: float = 60) -> httpx.Response:
    url = f"http://{server.http_url}/v2/models/slow/infer"
    return httpx.post(url, json=slow_body(iterations), timeout=timeout)


def assert_slow_answer(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    y = np.array(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, WIDTH)
    np.testing.assert_allclose(y, expected(X), rtol=1e-6)


def assert_slow_grpc_answer(response: service_pb2.ModelInferResponse) -> None:
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(1, WIDTH)
    np.testing.assert_allclose(y, expected(X), rtol=1e-6)


def raw_http_request(server: ServerProcess, iterations: int) -> socket.socket:
    """A request sent on a socket of our own, so the test decides when the client leaves."""
    body = json.dumps(slow_body(iterations)).encode()
    head = (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: {server.http_url}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(head + body)
    return sock


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def slow_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """One instance of the slow model, one request per batch, a queue of QUEUE; served by
    one process, and by two workers handing requests to the model-owning process (clients
    that leave, deadlines and a full queue must act the same through a worker)."""
    repo = tmp_path_factory.mktemp("slow_repo")
    write_slow_model(repo, "slow", QUEUE)
    server = start_server(repo, ["--workers", request.param])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def block_iterations(slow_server: ServerProcess) -> int:
    """Iterations that keep the instance busy for about BLOCK_SECONDS on this machine now
    (measured after a warm-up run; the faster of two runs, so the block is not too short)."""
    assert_slow_answer(slow_http(slow_server, 5))
    seconds = []
    for _ in range(2):
        started = time.monotonic()
        assert_slow_answer(slow_http(slow_server, CALIBRATION_ITERATIONS))
        seconds.append(time.monotonic() - started)
    per_iteration = min(seconds) / CALIBRATION_ITERATIONS
    return max(CALIBRATION_ITERATIONS, math.ceil(BLOCK_SECONDS / per_iteration))


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(16) as executor:
        yield executor


@pytest.fixture
def stub(slow_server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(slow_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _block(
    server: ServerProcess, pool: ThreadPoolExecutor, iterations: int
) -> Future[httpx.Response]:
    """Occupy the only instance; return once it is running."""
    blocker = pool.submit(slow_http, server, iterations)
    wait_until(
        lambda: metric(server, "batchserve_busy_instances", model="slow") == 1,
        what="the blocking request to start",
    )
    return blocker


def test_a_full_queue_is_refused_at_once_over_both_protocols(
    slow_server: ServerProcess,
    block_iterations: int,
    pool: ThreadPoolExecutor,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    blocker = _block(slow_server, pool, block_iterations)
    queued = [pool.submit(slow_http, slow_server, 1) for _ in range(QUEUE)]
    wait_until(
        lambda: metric(slow_server, "batchserve_queue_depth", model="slow") == QUEUE,
        what="the queue to fill",
    )

    started = time.monotonic()
    refused = slow_http(slow_server, 1)
    http_seconds = time.monotonic() - started
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(slow_grpc_request(1), timeout=30)
    grpc_seconds = time.monotonic() - started
    still_busy = not blocker.done()

    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"].startswith(
        "Exceeds maximum queue size (batchserve: queue is full"
    )
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error.value.details().startswith("Exceeds maximum queue size")
    assert still_busy, "the refusals must come while the model is busy"
    assert http_seconds < 1, http_seconds
    assert grpc_seconds < 1, grpc_seconds
    for future in [blocker, *queued]:
        assert_slow_answer(future.result())


def test_clients_that_leave_free_their_place_in_the_queue(
    slow_server: ServerProcess,
    block_iterations: int,
    pool: ThreadPoolExecutor,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    before = model_stats(slow_server, "slow")
    cancelled_before = metric(
        slow_server, "batchserve_rejected_requests_total", model="slow", reason="cancelled"
    )
    blocker = _block(slow_server, pool, block_iterations)
    # Four ways to leave: close the socket, an httpx read timeout, cancel the call, a deadline.
    sock = raw_http_request(slow_server, 1)
    timed_out = pool.submit(slow_http, slow_server, 1, LEAVE_AFTER)
    cancelled = stub.ModelInfer.future(slow_grpc_request(1), timeout=60)
    expired = stub.ModelInfer.future(slow_grpc_request(1), timeout=LEAVE_AFTER)
    wait_until(
        lambda: metric(slow_server, "batchserve_queue_depth", model="slow") == QUEUE,
        what="the queue to fill",
    )
    sock.close()
    cancelled.cancel()
    wait_until(
        lambda: (
            model_stats(slow_server, "slow")["fail"] - before["fail"] == QUEUE or blocker.done()
        ),
        what="the server to see all four clients leave",
    )
    assert not blocker.done(), "the blocking request ended before the clients left"

    # The queue holds only abandoned requests: new ones must take their places.
    http_new = [pool.submit(slow_http, slow_server, 1) for _ in range(QUEUE // 2)]
    grpc_new = [stub.ModelInfer.future(slow_grpc_request(1), timeout=60) for _ in range(2)]
    new = [*http_new, *grpc_new]
    wait_until(
        lambda: (
            any(f.done() for f in new)
            or metric(slow_server, "batchserve_inflight_requests", model="slow") == 1 + len(new)
        ),
        what="the new requests to be queued or answered",
    )
    still_busy = not blocker.done()

    with pytest.raises(httpx.ReadTimeout):
        timed_out.result()
    with pytest.raises(grpc.FutureCancelledError):
        cancelled.result()
    with pytest.raises(grpc.RpcError) as error:
        expired.result()
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for response in http_new:
        assert_slow_answer(response.result())
    for call in grpc_new:
        assert_slow_grpc_answer(call.result())
    assert still_busy, "the new requests must be admitted while the model is still busy"
    assert_slow_answer(blocker.result())

    after = model_stats(slow_server, "slow")
    ran = 1 + len(new)  # the blocker and the new ones; none of those that left
    assert after["execution_count"] - before["execution_count"] == ran
    assert after["success"] - before["success"] == ran
    assert after["fail"] - before["fail"] == QUEUE
    cancelled_after = metric(
        slow_server, "batchserve_rejected_requests_total", model="slow", reason="cancelled"
    )
    assert cancelled_after - cancelled_before == QUEUE


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_running_request_its_client_left_is_stopped_and_frees_the_instance(
    slow_server: ServerProcess,
    block_iterations: int,
    pool: ThreadPoolExecutor,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    protocol: str,
) -> None:
    """The blocking request would hold the only instance for about BLOCK_SECONDS. Its client
    leaves once it runs: ONNX Runtime stops the run (within a check period and a node), and
    a request sent then is answered at once rather than after the abandoned run."""
    before = model_stats(slow_server, "slow")
    cancelled_before = metric(
        slow_server, "batchserve_rejected_requests_total", model="slow", reason="cancelled"
    )
    stopped_before = metric(slow_server, "batchserve_stopped_batches_total", model="slow")
    if protocol == "http":
        sock = raw_http_request(slow_server, block_iterations)
        leave: Callable[[], object] = sock.close
    else:
        call = stub.ModelInfer.future(slow_grpc_request(block_iterations), timeout=60)
        leave = call.cancel
    wait_until(
        lambda: metric(slow_server, "batchserve_busy_instances", model="slow") == 1,
        what="the blocking request to start",
    )
    started = time.monotonic()
    leave()
    answer = slow_http(slow_server, 1)
    seconds = time.monotonic() - started
    assert_slow_answer(answer)
    assert seconds < BLOCK_SECONDS / 3, f"answered after {seconds:.2f} s: the run went on"
    after = model_stats(slow_server, "slow")
    assert after["execution_count"] - before["execution_count"] == 1, "the stopped run ran none"
    assert after["success"] - before["success"] == 1
    assert metric(slow_server, "batchserve_busy_instances", model="slow") == 0
    cancelled = metric(
        slow_server, "batchserve_rejected_requests_total", model="slow", reason="cancelled"
    )
    assert cancelled - cancelled_before == 1, "the one that left"
    stopped = metric(slow_server, "batchserve_stopped_batches_total", model="slow")
    assert stopped - stopped_before == 1


def test_cancelling_a_stream_drops_the_requests_it_queued(
    slow_server: ServerProcess,
    block_iterations: int,
    pool: ThreadPoolExecutor,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """A client that cancels its ModelStreamInfer call is gone: the requests it queued must
    not run (unary calls already behaved so; stream ones ran to the end)."""
    before = model_stats(slow_server, "slow")
    blocker = _block(slow_server, pool, block_iterations)
    stop = threading.Event()

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for _ in range(QUEUE):
            yield slow_grpc_request(1)
        stop.wait(60)  # the client keeps its stream open until it cancels

    stream = stub.ModelStreamInfer(requests())
    wait_until(
        lambda: metric(slow_server, "batchserve_queue_depth", model="slow") == QUEUE,
        what="the stream's requests to be queued",
    )
    stream.cancel()
    stop.set()
    wait_until(
        lambda: (
            model_stats(slow_server, "slow")["fail"] - before["fail"] == QUEUE or blocker.done()
        ),
        what="the server to drop the cancelled stream's requests",
    )
    assert not blocker.done(), "the blocking request ended before the stream was cancelled"
    assert_slow_answer(blocker.result())
    after = model_stats(slow_server, "slow")
    assert after["execution_count"] - before["execution_count"] == 1  # the blocker alone
    assert after["fail"] - before["fail"] == QUEUE


# load and unload under traffic ------------------------------------------------------------
TOKEN = CONTROL_TOKEN
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)
IMAGE = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17
TOKENS = np.array([[3 + (i * 7) % 60 for i in range(12)]], dtype=np.int64)


@dataclass(frozen=True)
class Target:
    """One model's request over both protocols and how to read its answer."""

    model: str
    output: str
    inputs: tuple[tuple[str, str, np.ndarray], ...]

    def http_body(self) -> dict[str, object]:
        tensors = [
            {"name": n, "datatype": d, "shape": list(a.shape), "data": a.ravel().tolist()}
            for n, d, a in self.inputs
        ]
        return {"inputs": tensors, "outputs": [{"name": self.output}]}

    def grpc_request(self) -> service_pb2.ModelInferRequest:
        request = service_pb2.ModelInferRequest(model_name=self.model)
        for name, datatype, array in self.inputs:
            request.inputs.add(name=name, datatype=datatype, shape=array.shape)
            request.raw_input_contents.append(array.tobytes())
        request.outputs.add(name=self.output)
        return request

    def from_http(self, response: httpx.Response) -> np.ndarray:
        output = response.json()["outputs"][0]
        return np.array(output["data"], dtype=np.float32).reshape(output["shape"])

    def from_grpc(self, response: service_pb2.ModelInferResponse) -> np.ndarray:
        shape = list(response.outputs[0].shape)
        return np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(shape)


DIGITS = Target("digits_cnn", "logits", (("image", "FP32", IMAGE),))
LSTM = Target(
    "char_lstm",
    "next_char_logits",
    (("tokens", "INT64", TOKENS), ("lengths", "INT64", np.array([[TOKENS.shape[1]]]))),
)


@dataclass
class Traffic:
    """Threads sending one model requests over both protocols, back to back, until stopped.

    Every request ends in exactly one outcome: ``ok`` (answered, and the answer matches the
    reference), ``http <status>`` or ``grpc <code>`` with the error message checked, or a
    transport failure (a hang shows as a timeout). ``ok_at`` holds when each ok came.
    """

    server: ServerProcess
    target: Target
    reference: np.ndarray
    seen: Counter[str] = field(default_factory=Counter)
    ok_at: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, outcome: str) -> None:
        with self._lock:
            self.seen[outcome] += 1
            if outcome == "ok":
                self.ok_at.append(time.monotonic())

    def _matches(self, answer: np.ndarray) -> bool:
        return answer.shape == self.reference.shape and bool(
            np.allclose(answer, self.reference, rtol=1e-4, atol=1e-4)
        )

    def _http(self) -> None:
        body = self.target.http_body()
        url = f"/v2/models/{self.target.model}/infer"
        with httpx.Client(base_url=f"http://{self.server.http_url}", timeout=30) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(url, json=body)
                except httpx.HTTPError as exc:
                    self._record(f"http {type(exc).__name__}")
                    continue
                self._record(self._http_outcome(response))

    def _http_outcome(self, response: httpx.Response) -> str:
        try:
            if response.status_code == 200:
                return "ok" if self._matches(self.target.from_http(response)) else "bad"
            named = self.target.model in response.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"http {response.status_code} with a body not in the protocol"
        return f"http {response.status_code}" + ("" if named else " without the model's name")

    def _grpc(self) -> None:
        request = self.target.grpc_request()
        with grpc.insecure_channel(self.server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while not self._stop.is_set():
                try:
                    response = stub.ModelInfer(request, timeout=30)
                except grpc.RpcError as error:
                    named = self.target.model in (error.details() or "")
                    suffix = "" if named else " without the model's name"
                    self._record(f"grpc {error.code().name}{suffix}")
                    continue
                self._record("ok" if self._matches(self.target.from_grpc(response)) else "bad")

    def __enter__(self) -> Traffic:
        loops = [self._http, self._grpc] * 2
        self._threads = [threading.Thread(target=loop) for loop in loops]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not any(t.is_alive() for t in self._threads), "a client hangs"

    def count(self, *outcomes: str) -> int:
        with self._lock:
            return sum(self.seen[o] for o in outcomes)


def _control(server: ServerProcess, action: str, model: str, protocol: str) -> None:
    """Load or unload ``model`` over ``protocol``; returns once the server has done it."""
    if protocol == "http":
        url = f"http://{server.http_url}/v2/repository/models/{model}/{action}"
        response = httpx.post(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
        assert response.status_code == 200, response.text
        return
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        if action == "load":
            request = service_pb2.RepositoryModelLoadRequest(model_name=model)
            stub.RepositoryModelLoad(request, metadata=GRPC_AUTH, timeout=120)
        else:
            unload = service_pb2.RepositoryModelUnloadRequest(model_name=model)
            stub.RepositoryModelUnload(unload, metadata=GRPC_AUTH, timeout=120)


def _reference(server: ServerProcess, target: Target) -> np.ndarray:
    url = f"http://{server.http_url}/v2/models/{target.model}/infer"
    response = httpx.post(url, json=target.http_body(), timeout=30)
    assert response.status_code == 200, response.text
    return target.from_http(response)


def test_loading_and_unloading_a_model_never_disturbs_another(
    explicit_server: ServerProcess,
) -> None:
    reference = _reference(explicit_server, DIGITS)
    before = model_stats(explicit_server, "digits_cnn")
    with Traffic(explicit_server, DIGITS, reference) as traffic:
        for cycle in range(3):
            wait_until(lambda: traffic.count("ok") > 0, what="traffic to flow")
            load, unload = ("http", "grpc") if cycle % 2 == 0 else ("grpc", "http")
            _control(explicit_server, "load", "char_lstm", load)
            assert _reference(explicit_server, LSTM).shape == (1, 98)
            _control(explicit_server, "unload", "char_lstm", unload)
    after = model_stats(explicit_server, "digits_cnn")

    assert set(traffic.seen) == {"ok"}, traffic.seen
    assert traffic.count("ok") >= 20, traffic.seen
    assert after["fail"] == before["fail"]
    assert after["success"] - before["success"] == traffic.count("ok")


def test_a_model_unloaded_under_its_own_traffic_answers_or_refuses_every_request(
    explicit_server: ServerProcess,
) -> None:
    _control(explicit_server, "load", "char_lstm", "http")
    reference = _reference(explicit_server, LSTM)
    refusals = ("http 503", "http 404", "grpc UNAVAILABLE", "grpc NOT_FOUND")
    with Traffic(explicit_server, LSTM, reference) as traffic:
        wait_until(lambda: traffic.count("ok") >= 10, what="answers before the unload")
        _control(explicit_server, "unload", "char_lstm", "grpc")
        wait_until(
            lambda: traffic.count("http 503") >= 5 and traffic.count("grpc UNAVAILABLE") >= 5,
            what="refusals over both protocols while unloaded",
        )
        _control(explicit_server, "load", "char_lstm", "http")
        reloaded = time.monotonic()
        wait_until(
            lambda: sum(at > reloaded for at in traffic.ok_at) >= 10,
            what="answers after the reload",
        )
    stats = model_stats(explicit_server, "char_lstm")  # the reloaded version's counters

    assert set(traffic.seen) <= {"ok", *refusals}, traffic.seen
    answered_after_reload = sum(at > reloaded for at in traffic.ok_at)
    assert stats["success"] >= answered_after_reload
    assert stats["fail"] == 0
    np.testing.assert_allclose(_reference(explicit_server, LSTM), reference, rtol=1e-5)


# a model that cannot load -------------------------------------------------------------------
def test_a_model_that_fails_to_load_leaves_the_others_serving(tmp_path: Path) -> None:
    for name in ("digits_cnn", "char_lstm"):
        shutil.copytree(MODEL_REPO / name, tmp_path / name)
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "broken")
    config = tmp_path / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('"digits_cnn"', '"broken"'))
    model_file = tmp_path / "broken" / "1" / "model.onnx"
    model_file.write_bytes(model_file.read_bytes()[:1000] + b"\xff" * 1000)
    (tmp_path / "looped" / "1").mkdir(parents=True)  # a link to itself used to stop the server
    (tmp_path / "looped" / "1" / "model.onnx").symlink_to("model.onnx")

    server = start_server(tmp_path, wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
            ready = http.get("/v2/health/ready")
            live = http.get("/v2/health/live")
            broken_ready = http.get("/v2/models/broken/ready")
            broken_infer = http.post("/v2/models/broken/infer", json=DIGITS.http_body())
        answers = {t.model: _reference(server, t) for t in (DIGITS, LSTM)}
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            grpc_ready = stub.ServerReady(service_pb2.ServerReadyRequest()).ready
            grpc_live = stub.ServerLive(service_pb2.ServerLiveRequest()).live
            grpc_answers = {
                t.model: t.from_grpc(stub.ModelInfer(t.grpc_request(), timeout=30))
                for t in (DIGITS, LSTM)
            }
            to_broken = DIGITS.grpc_request()
            to_broken.model_name = "broken"
            with pytest.raises(grpc.RpcError) as error:
                stub.ModelInfer(to_broken, timeout=30)
    finally:
        assert server.stop() == 0

    failures = [r for r in server.logs if r.get("message") == "model failed to load"]
    assert [r["model"] for r in failures] == ["broken", "looped"]
    reason = str(failures[0]["reason"])
    assert "broken" in reason
    assert failures[1]["reason"] == "looped/1/model.onnx: is a symlink loop"
    # Readiness is strict, as the deployment guide says: every model loaded, else 503.
    assert ready.status_code == 503
    assert not grpc_ready
    assert live.status_code == 200
    assert grpc_live
    assert broken_ready.status_code == 503
    assert broken_infer.status_code == 503
    assert "broken" in broken_infer.json()["error"]
    assert reason in broken_infer.json()["error"]
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert reason in error.value.details()
    assert answers["digits_cnn"].shape == (1, 10)
    assert answers["char_lstm"].shape == (1, 98)
    for model, answer in grpc_answers.items():
        np.testing.assert_allclose(answer, answers[model], rtol=1e-5, atol=1e-5)
