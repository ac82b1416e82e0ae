"""Requests in flight are bounded by the memory they hold (``--max-request-memory``): past
it, new ones are refused at once with 503 / UNAVAILABLE, counted, and what was admitted is
answered whole; once they are answered, their memory is free for the next. An answer its
client stops taking holds its share until ``--http-send-timeout`` aborts the connection.

Eight 16 MiB requests reach an identity model that holds each for 1.5 s, all at once, with
40 MiB for requests: one process admits two (32 MiB; a third would make 48), and each of
two workers, with a share of 20 MiB, admits one. Sixty such requests to an unbounded
server held 6.3 GiB of one process on the 2-core reference machine.
"""

from __future__ import annotations

import json
import queue
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.h2_frames import (
    ACK_FLAG,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    frame,
    grpc_call_headers,
    read_frame,
)
from tests.integration.server import ServerProcess, metric, start_server

MIB = 1 << 20
ELEMENTS = 4 * MIB  # FP32: 16 MiB a request
SENT = 8
LIMIT = "40MiB"
CONFIG = """
name: "held"
backend: "identity"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]
parameters [{ key: "execute_delay_ms" value: { string_value: "1500" } }]
"""
REFUSED = "the server is out of memory for requests"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _write_repository(root: Path, delay_ms: int = 1500) -> Path:
    (root / "held" / "1").mkdir(parents=True)
    (root / "held" / "config.pbtxt").write_text(CONFIG.replace("1500", str(delay_ms)))
    return root


def _payload(seed: int) -> np.ndarray:
    return (np.arange(ELEMENTS, dtype=np.float32) + seed) % 1009


def _ask_http(server: ServerProcess, seed: int) -> str:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("INPUT0", [ELEMENTS], "FP32")
        tensor.set_data_from_numpy(_payload(seed), binary_data=True)
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        result = client.infer("held", [tensor], outputs=[output])
        echoed = result.as_numpy("OUTPUT0")
        return "ok" if np.array_equal(echoed, _payload(seed)) else "wrong answer"
    except InferenceServerException as exc:
        return str(exc.message())
    finally:
        client.close()


def _ask_grpc(server: ServerProcess, seed: int) -> str:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [ELEMENTS], "FP32")
        tensor.set_data_from_numpy(_payload(seed))
        result = client.infer("held", [tensor], client_timeout=60)
        echoed = result.as_numpy("OUTPUT0")
        return "ok" if np.array_equal(echoed, _payload(seed)) else "wrong answer"
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("workers", "admitted"), [("1", 2), ("2", 2)], ids=["one process", "two workers"]
)
def test_requests_past_the_memory_for_requests_are_refused_and_the_rest_answered(
    tmp_path: Path, protocol: str, workers: str, admitted: int
) -> None:
    server = start_server(
        _write_repository(tmp_path), ["--workers", workers, "--max-request-memory", LIMIT]
    )
    ask = _ask_http if protocol == "http" else _ask_grpc
    try:
        with ThreadPoolExecutor(SENT) as pool:
            answers = list(pool.map(lambda seed: ask(server, seed), range(SENT)))
        answered = [a for a in answers if a == "ok"]
        refused = [a for a in answers if a != "ok"]
        if workers == "1":
            assert len(answered) == admitted, answers
        else:  # each worker admits one: two, unless the port gave one worker all eight
            assert 1 <= len(answered) <= admitted, answers
        assert all(REFUSED in a and "--max-request-memory" in a for a in refused), refused
        if protocol == "grpc":
            assert all(a.startswith("StatusCode.UNAVAILABLE") for a in refused), refused
        counted = metric(
            server, "batchserve_refusals_total", protocol=protocol, reason="request_memory"
        )
        assert counted == len(refused)
        # Their memory was given back: one at a time, every request is admitted.
        assert [ask(server, seed) for seed in range(2)] == ["ok", "ok"]
        assert metric(server, "batchserve_request_memory_held_bytes") == 0
        assert metric(server, "batchserve_request_memory_limit_bytes") == 40 * MIB
    finally:
        assert server.stop() == 0


def test_a_stream_s_requests_past_the_memory_for_requests_get_errors_on_the_stream(
    tmp_path: Path,
) -> None:
    """Over one ModelStreamInfer stream: each request is counted until its last response;
    those refused get their error on the stream, which goes on serving."""
    server = start_server(_write_repository(tmp_path), ["--max-request-memory", LIMIT])
    results: queue.Queue[tuple[object, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for seed in range(5):
            tensor = grpcclient.InferInput("INPUT0", [ELEMENTS], "FP32")
            tensor.set_data_from_numpy(_payload(seed))
            client.async_stream_infer("held", [tensor], request_id=str(seed))
        got = [results.get(timeout=60) for _ in range(5)]
        answered = {
            result.get_response().id: result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
            for result, error in got
            if error is None
        }
        errors = [str(error) for _, error in got if error is not None]
        assert sorted(answered) == ["0", "1"], errors
        for seed, echoed in answered.items():
            np.testing.assert_array_equal(echoed, _payload(int(seed)))
        assert len(errors) == 3, errors
        assert all(REFUSED in e for e in errors), errors
        tensor = grpcclient.InferInput("INPUT0", [ELEMENTS], "FP32")
        tensor.set_data_from_numpy(_payload(9))
        client.async_stream_infer("held", [tensor], request_id="9")
        result, error = results.get(timeout=60)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), _payload(9))  # type: ignore[attr-defined]
        client.stop_stream()
    finally:
        client.close()
        assert server.stop() == 0


def _raw_request(seed: int) -> bytes:
    """A binary HTTP inference request for ``_payload(seed)`` and its echo."""
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [ELEMENTS], "datatype": "FP32",
                 "parameters": {"binary_data_size": ELEMENTS * 4}}
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    body = header + _payload(seed).tobytes()
    head = (
        "POST /v2/models/held/infer HTTP/1.1\r\nHost: test\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _read_until_closed(sock: socket.socket) -> int:
    """Bytes read before the connection closed or was reset."""
    received = 0
    try:
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    return received


def test_an_answer_never_taken_holds_its_memory_until_the_send_timeout_aborts_it(
    tmp_path: Path,
) -> None:
    """A client that sends a 16 MiB request and never reads its 16 MiB answer holds 32 of
    the 40 MiB: the next request is refused until ``--http-send-timeout`` (2 s) aborts the
    stuck connection, counted; then it is served."""
    server = start_server(
        _write_repository(tmp_path, delay_ms=0),
        ["--max-request-memory", LIMIT, "--http-send-timeout", "2"],
    )
    stuck = socket.socket()
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stuck.connect(("127.0.0.1", server.http_port))
        stuck.sendall(_raw_request(0))
        time.sleep(0.5)  # its answer is written, and waits in the server
        assert REFUSED in _ask_http(server, 1)
        # its body and its answer, 16 MiB each, to within the answer's JSON header
        held = metric(server, "batchserve_request_memory_held_bytes")
        assert 32 * MIB <= held < 33 * MIB, held
        started = time.monotonic()
        deadline = started + 30
        while _ask_http(server, 2) != "ok":
            assert time.monotonic() < deadline, "the stuck answer was never dropped"
            time.sleep(0.2)
        assert time.monotonic() - started > 0.5  # held until the timeout, not at once
        assert (
            metric(server, "batchserve_refusals_total", protocol="http", reason="send_timeout") == 1
        )
        stuck.settimeout(10)
        assert _read_until_closed(stuck) < ELEMENTS * 4, "the dropped answer came whole"
    finally:
        stuck.close()
        assert server.stop() == 0


EXPAND = f"""
name: "expand"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [{{ name: "x" data_type: TYPE_FP32 dims: [1] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [{ELEMENTS}] }}]
"""
"""A 4-byte request, a 16 MiB answer: what a client that stops reading leaves in the server."""


def _write_expand(root: Path) -> Path:
    shape = onnx.numpy_helper.from_array(np.array([ELEMENTS], dtype=np.int64), "shape")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Expand", ["x", "shape"], ["y"])],
        "expand",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [ELEMENTS])],
        [shape],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    (root / "expand" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "expand" / "1" / "model.onnx"))
    (root / "expand" / "config.pbtxt").write_text(EXPAND)
    return root


def _expand_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="expand")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([3.0], dtype=np.float32).tobytes())
    return request


def _stuck_grpc_call(server: ServerProcess) -> socket.socket:
    """An HTTP/2 connection that makes one ModelInfer call and never grants the server more
    than the first 64 KiB of window: the 16 MiB answer stays in the server."""
    message = _expand_request().SerializeToString()
    sock = socket.create_connection(("127.0.0.1", server.grpc_port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
    sock.sendall(frame(HEADERS, END_HEADERS, 1, grpc_call_headers(MODEL_INFER)))
    sock.sendall(frame(DATA, END_STREAM, 1, b"\0" + len(message).to_bytes(4, "big") + message))
    sock.settimeout(10)
    deadline = time.monotonic() + 10
    answered = 0  # DATA bytes of the answer received: the window's worth, then no more
    while answered < 60_000 and time.monotonic() < deadline:
        received = read_frame(sock)
        assert received is not None, "the server closed the connection"
        if received.kind == SETTINGS and not received.flags & ACK_FLAG:
            sock.sendall(frame(SETTINGS, ACK_FLAG, 0))
        elif received.kind == DATA:
            answered += len(received.payload)
    assert answered >= 60_000, answered
    return sock


def _expand_served(server: ServerProcess) -> str:
    options = [("grpc.max_receive_message_length", 64 * MIB)]
    with grpc.insecure_channel(server.grpc_url, options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            answer = stub.ModelInfer(_expand_request(), timeout=30)
        except grpc.RpcError as exc:
            return f"{exc.code()} {exc.details()}"
    values = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
    return "ok" if values.shape == (ELEMENTS,) and np.all(values == 3.0) else "wrong answer"


def test_a_grpc_answer_never_read_stays_counted_until_its_call_ends(tmp_path: Path) -> None:
    """Over gRPC the answer of a call whose client stops reading waits in grpc core, after the
    handler has returned: its 16 MiB stay counted (16 MiB allowed), so the next call is
    refused, until the stuck client leaves and its call ends."""
    server = start_server(_write_expand(tmp_path), ["--max-request-memory", "16MiB"])
    try:
        stuck = _stuck_grpc_call(server)
        try:
            refused = _expand_served(server)
            assert refused.startswith("StatusCode.UNAVAILABLE"), refused
            assert REFUSED in refused
        finally:
            stuck.close()
        deadline = time.monotonic() + 30
        while (served := _expand_served(server)) != "ok":
            assert time.monotonic() < deadline, served
            time.sleep(0.2)
    finally:
        assert server.stop() == 0
