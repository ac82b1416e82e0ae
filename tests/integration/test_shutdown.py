"""SIGTERM under load: the server turns not-ready, answers every request it accepted on both
protocols, refuses the rest, unloads, and exits 0 in bounded time."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.server import ServerProcess, start_server

IMAGE = (np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17).tobytes()


def _http_loop(server: ServerProcess, stop: threading.Event, seen: Counter[str]) -> None:
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                        "data": np.frombuffer(IMAGE, dtype=np.float32).tolist()}]}  # fmt: skip
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        while not stop.is_set():
            try:
                response = client.post("/v2/models/digits_cnn/infer", json=body)
            except httpx.TransportError:
                seen["http refused"] += 1
                time.sleep(0.01)
                continue
            ok = response.status_code == 200 and response.json()["outputs"][0]["shape"] == [1, 10]
            seen["http ok" if ok else f"http {response.status_code}"] += 1


def _grpc_loop(server: ServerProcess, stop: threading.Event, seen: Counter[str]) -> None:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(IMAGE)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            try:
                response = stub.ModelInfer(request, timeout=30)
            except grpc.RpcError as error:
                seen[f"grpc {error.code().name}"] += 1
                time.sleep(0.01)
                continue
            seen["grpc ok" if len(response.raw_output_contents[0]) == 40 else "grpc bad"] += 1


def _readiness_once_signalled(server: ServerProcess, timeout: float = 20.0) -> int | None:
    """The readiness status once the server has handled SIGTERM, polled until it is no longer
    200 however long a loaded machine takes to deliver the signal; None when the listener
    closed first (the not-ready window of the shutdown delay was never seen)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = httpx.get(f"http://{server.http_url}/v2/health/ready").status_code
        except httpx.TransportError:
            return None
        if status != 200 or time.monotonic() > deadline:
            return status
        time.sleep(0.02)


def test_sigterm_under_load_loses_no_accepted_request() -> None:
    server = start_server(extra_args=["--shutdown-delay", "0.5", "--shutdown-timeout", "20"])
    stop = threading.Event()
    seen: Counter[str] = Counter()
    loops = [_http_loop] * 4 + [_grpc_loop] * 4
    threads = [threading.Thread(target=loop, args=(server, stop, seen)) for loop in loops]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    before_ready = httpx.get(f"http://{server.http_url}/v2/health/ready").status_code
    started = time.monotonic()
    server.process.send_signal(15)
    during_delay = _readiness_once_signalled(server)
    code = server.process.wait(60)
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(30)
    server.stop()

    assert code == 0
    assert elapsed < 25
    assert before_ready == 200
    assert during_delay == 503, "the server must turn not-ready at once on SIGTERM"
    finals = [r for r in server.logs if r.get("message") == "final statistics"]
    answered = sum(int(str(r["success"])) for r in finals)
    failed = sum(int(str(r["fail"])) for r in finals)
    assert failed == 0
    assert seen["http ok"] + seen["grpc ok"] == answered, seen
    assert seen["http ok"] > 0
    assert seen["grpc ok"] > 0
    # Refusals: the listener is closed (HTTP), or grpc core turns the call away before any
    # handler ran (UNAVAILABLE, or CANCELLED for a call caught mid-shutdown); the accounting
    # above proves none of those reached the model.
    refusals = ("http refused", "grpc UNAVAILABLE", "grpc CANCELLED")
    unexpected = {k: v for k, v in seen.items() if k not in ("http ok", "grpc ok", *refusals)}
    assert not unexpected, seen
    draining = [r.get("message") for r in server.logs].index(
        "shutting down: draining accepted requests"
    )
    assert "heap frozen" not in [r.get("message") for r in server.logs[draining:]]  # exiting
