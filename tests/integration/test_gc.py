"""The collector as the server runs it: startup objects frozen, young collections rare."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.server import ServerProcess, metric, rss_mib

CLIENTS = 32
REQUESTS_EACH = 60
MOST_YOUNG_COLLECTIONS = 10
"""What 32 clients in flight cost with CPython's default threshold (700): ~50 young
collections for these ~2,000 requests. One client at a time sets off none either way: what a
request allocates is freed before the next one starts."""


def test_the_loaded_server_froze_what_it_started_with(server: ServerProcess) -> None:
    """Once, after the last start-up load (settling after each load cost a full collection,
    ~80 ms on 2 cores, per model)."""
    messages = [str(record.get("message")) for record in server.logs]
    start_up = messages[: messages.index("server ready")]
    assert start_up.count("model ready") == start_up.count("loading model") > 1
    assert start_up.count("heap frozen") == 1
    assert start_up.index("heap frozen") > max(
        i for i, m in enumerate(start_up) if m == "model ready"
    )
    (frozen,) = [r for r in server.logs[: len(start_up)] if r.get("message") == "heap frozen"]
    assert int(str(frozen["frozen_objects"])) > 20_000


def _client(url: str) -> int:
    """``REQUESTS_EACH`` binary requests one after the other; the answers that came back."""
    image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.ones((1, 1, 8, 8), np.float32), binary_data=True)
    wanted = [httpclient.InferRequestedOutput("probabilities", binary_data=True)]
    client = httpclient.InferenceServerClient(url)
    try:
        answers = [
            client.infer("digits_cnn", [image], outputs=wanted) for _ in range(REQUESTS_EACH)
        ]
    finally:
        client.close()
    return sum(a.as_numpy("probabilities") is not None for a in answers)


def test_requests_in_flight_do_not_set_off_young_collections(server: ServerProcess) -> None:
    before = metric(server, "python_gc_collections_total", generation="0")
    with ThreadPoolExecutor(CLIENTS) as pool:
        answered = sum(pool.map(_client, [server.http_url] * CLIENTS))
    after = metric(server, "python_gc_collections_total", generation="0")
    assert answered == CLIENTS * REQUESTS_EACH
    assert after - before <= MOST_YOUNG_COLLECTIONS


FAILED_CALLS = 8
FAILED_CALL_BYTES = 48 << 20
MOST_GROWTH_MIB = 300
"""Before the fix each failed call kept ~100 MiB (its message and tensor) for good: eight
took RSS up by ~850 MiB. Freed, what stays is the allocator's working set."""


def test_failed_large_grpc_calls_do_not_keep_their_requests(server: ServerProcess) -> None:
    """An aborted call's exception held the frames that held its request; with the collector
    tuned to run rarely, every failed large ModelInfer stayed in memory."""
    request = service_pb2.ModelInferRequest(model_name="no_such_model")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, FAILED_CALL_BYTES // 4])
    assert tensor.name == "x"
    request.raw_input_contents.append(bytes(FAILED_CALL_BYTES))
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        before = rss_mib(server.process.pid)
        for _ in range(FAILED_CALLS):
            with pytest.raises(grpc.RpcError) as failed:
                stub.ModelInfer(request, timeout=60)
            assert failed.value.code() is not grpc.StatusCode.OK
        grown = rss_mib(server.process.pid) - before
    assert grown < MOST_GROWTH_MIB, f"RSS grew {grown} MiB over {FAILED_CALLS} failed calls"
