"""The gRPC listener's own limits, seen from outside over loopback: connections that never
finish their handshake, sit idle, stop answering pings, outlive their maximum age or ping
too often are closed; a burst of calls is answered or refused with a status that the
refusal counter accounts for, never dropped by grpc core unseen; and streams do not hold a
shutdown once they owe no answer.

The server runs with limits of a second or so, so each test takes a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.h2_frames import (
    ACK_FLAG,
    CANCEL,
    END_HEADERS,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    Frame,
    frame,
    frames_until_closed,
    goaway_reason,
    grpc_call_headers,
    read_frame,
)
from tests.integration.server import ServerProcess, metric, rss_mib, start_server
from tests.integration.slow_model import WIDTH, expected, write_slow_model

HANDSHAKE_MS = 1000
IDLE_MS = 1500
KEEPALIVE_MS = 1000
QUEUE = 16
MAX_CALLS = 64
SLACK = 2.0
"""Seconds a limit may be late by on a busy machine: core checks its timers coarsely."""
LIMITS = [
    "--grpc-handshake-timeout", str(HANDSHAKE_MS),
    "--grpc-max-connection-idle", str(IDLE_MS),
    "--grpc-keepalive-time", str(KEEPALIVE_MS),
    "--grpc-keepalive-timeout", str(KEEPALIVE_MS),
    "--grpc-max-concurrent-calls", str(MAX_CALLS),
    "--max-queue-size", str(QUEUE),
]  # fmt: skip
IMAGE = (np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) % 17).tobytes()
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    server = start_server(extra_args=LIMITS)
    yield server
    assert server.stop() == 0


def digits_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(IMAGE)
    return request


def refusals(server: ServerProcess, **labels: str) -> float:
    return metric(server, "batchserve_refusals_total", protocol="grpc", **labels)


def assert_serves(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            digits_request(), timeout=30
        )
    assert len(answer.raw_output_contents[0]) == 40


# connections ------------------------------------------------------------------------------
def test_a_silent_connection_is_closed_by_the_handshake_timeout(limited: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", limited.grpc_port)) as sock:
        frames, seconds = frames_until_closed(sock, timeout=30, answer_settings=False)
    assert HANDSHAKE_MS / 1000 - 0.2 < seconds < HANDSHAKE_MS / 1000 + SLACK
    assert b"handshake timeout" in (goaway_reason(frames) or b""), frames
    assert_serves(limited)


def test_a_preface_sent_a_byte_a_second_is_closed_by_the_handshake_timeout(
    limited: ServerProcess,
) -> None:
    started = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", limited.grpc_port)) as sock:
        try:
            while sent < len(PREFACE) and time.monotonic() - started < 30:
                sock.sendall(PREFACE[sent : sent + 1])
                sent += 1
                # Read (and drop) what the server sends; an empty read is its close.
                if select.select([sock], [], [], 1.0)[0] and not _drain(sock):
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
    seconds = time.monotonic() - started
    assert sent < len(PREFACE), "the whole preface went through a byte a second"
    assert seconds < HANDSHAKE_MS / 1000 + SLACK
    assert_serves(limited)


def _drain(sock: socket.socket) -> bool:
    """Read what is waiting; False once the server has closed the connection."""
    try:
        while select.select([sock], [], [], 0)[0]:
            if not sock.recv(65536):
                return False
    except ConnectionResetError:
        return False
    return True


def test_an_idle_connection_gets_goaway_and_its_client_reconnects(
    limited: ServerProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", limited.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        frames, seconds = frames_until_closed(sock, timeout=30)
    assert goaway_reason(frames) == b"connection idle", frames
    assert IDLE_MS / 1000 - 0.2 < seconds < IDLE_MS / 1000 + SLACK

    # A real client's channel sees its connection go and makes a new one for its next call.
    with grpc.insecure_channel(limited.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append)
        deadline = time.monotonic() + IDLE_MS / 1000 + SLACK
        while grpc.ChannelConnectivity.IDLE not in states and time.monotonic() < deadline:
            time.sleep(0.05)
        assert grpc.ChannelConnectivity.IDLE in states, states
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live


def test_a_peer_that_stops_answering_pings_is_dropped(limited: ServerProcess) -> None:
    """A call stays open (a stream the client never writes to), so the connection is not
    idle; the server's keepalive ping goes unanswered and the connection is closed."""
    with socket.create_connection(("127.0.0.1", limited.grpc_port)) as sock:
        opening = frame(HEADERS, END_HEADERS, 1, grpc_call_headers(STREAM_INFER))
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + opening)
        frames, seconds = frames_until_closed(sock, timeout=30)
    assert any(f.kind == PING for f in frames), frames
    assert goaway_reason(frames) == b"ping_timeout", frames
    assert seconds < 2 * KEEPALIVE_MS / 1000 + SLACK
    assert_serves(limited)


# connection age and ping policy -----------------------------------------------------------
AGE_MS = 1000
GRACE_MS = 500
ENHANCE_YOUR_CALM = 0xB
"""The HTTP/2 error code of a GOAWAY for a peer that pings too often."""
PING_PAYLOAD = b"8 bytes!"


@pytest.fixture(scope="module")
def aged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Connections live a second, and the second bad ping is one too many (grpc's default
    allows two). An empty repository: no call here needs a model."""
    args = [
        "--grpc-max-connection-age", str(AGE_MS),
        "--grpc-max-connection-age-grace", str(GRACE_MS),
        "--grpc-http2-max-ping-strikes", "1",
    ]  # fmt: skip
    server = start_server(tmp_path_factory.mktemp("empty_repo"), args)
    yield server
    assert server.stop() == 0


def _goaway_code(frames: list[Frame]) -> int | None:
    for received in frames:
        if received.kind == GOAWAY:
            return int.from_bytes(received.payload[4:8], "big")
    return None


def test_a_connection_past_its_maximum_age_gets_goaway_and_its_client_reconnects(
    aged: ServerProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", aged.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        frames, seconds = frames_until_closed(sock, timeout=30)
    assert goaway_reason(frames) == b"max_age", frames
    # grpc core jitters the age by 10 %; the grace then runs before it closes.
    assert 0.9 * AGE_MS / 1000 - 0.2 < seconds < (1.1 * AGE_MS + GRACE_MS) / 1000 + SLACK

    # A real client's channel is told to go, and its next call opens a new connection.
    with grpc.insecure_channel(aged.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append)
        deadline = time.monotonic() + (1.1 * AGE_MS + GRACE_MS) / 1000 + SLACK
        while grpc.ChannelConnectivity.IDLE not in states and time.monotonic() < deadline:
            time.sleep(0.05)
        assert grpc.ChannelConnectivity.IDLE in states, states
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
        # the call went over a new connection; grpc reports states from a thread of its own,
        # which on a busy machine tells of READY after the call has returned
        deadline = time.monotonic() + 10
        while states[-1] != grpc.ChannelConnectivity.READY and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states[-1] == grpc.ChannelConnectivity.READY, states


def _pings_until_goaway(server: ServerProcess, most: int) -> tuple[int, list[Frame]]:
    """Ping with no call open, each ping once the last is acknowledged, until GOAWAY or
    ``most`` pings: how many were sent, and every frame the server sent."""
    pings = 0
    frames: list[Frame] = []
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        sock.settimeout(10)
        while pings < most and goaway_reason(frames) is None:
            sock.sendall(frame(PING, 0, 0, PING_PAYLOAD))
            pings += 1
            while (received := read_frame(sock)) is not None:
                frames.append(received)
                if received.kind == SETTINGS and not received.flags & ACK_FLAG:
                    sock.sendall(frame(SETTINGS, ACK_FLAG, 0))
                if received.kind == GOAWAY or (received.kind == PING and received.flags):
                    break
    return pings, frames


def test_a_client_pinging_past_the_strike_limit_gets_goaway_too_many_pings(
    aged: ServerProcess,
) -> None:
    """No call is open and pings are not permitted without one, so every ping after the
    first is a strike. grpc 1.85 sent GOAWAY at the 5th ping with its default of 2 strikes
    (and at the 6th with 3): at the 4th, the limit of 1 is the one in force."""
    pings, frames = _pings_until_goaway(aged, 10)
    assert goaway_reason(frames) == b"too_many_pings", frames
    assert _goaway_code(frames) == ENHANCE_YOUR_CALM
    assert pings == 4, f"GOAWAY after {pings} pings"
    with grpc.insecure_channel(aged.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live


def test_pings_without_calls_are_no_strikes_once_permitted_at_any_interval(
    tmp_path: Path,
) -> None:
    """Both settings are needed: without the permit, a ping with no call open is held to
    two hours whatever the interval."""
    args = ["--grpc-keepalive-permit-without-calls", "true",
            "--grpc-http2-min-recv-ping-interval-without-data", "0"]  # fmt: skip
    server = start_server(tmp_path, args)
    try:
        pings, frames = _pings_until_goaway(server, 12)
    finally:
        assert server.stop() == 0
    assert (pings, goaway_reason(frames)) == (12, None), frames


# calls ------------------------------------------------------------------------------------
BURST = 3000


async def _burst(server: ServerProcess) -> Counter[tuple[str, bool]]:
    """BURST unary calls at once on one channel: (status, has a message) of each."""
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        await stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
        request = digits_request()

        async def one() -> tuple[str, bool]:
            try:
                await stub.ModelInfer(request, timeout=60)
            except grpc.aio.AioRpcError as error:
                return error.code().name, bool(error.details())
            return "OK", True

        return Counter(await asyncio.gather(*(one() for _ in range(BURST))))


def test_every_call_of_a_burst_is_answered_or_refused_and_counted(
    limited: ServerProcess,
) -> None:
    """grpc core used to cancel some calls of a burst (its backlog of calls the server had
    not picked up yet) before any handler saw them: CANCELLED, counted nowhere."""
    before = refusals(limited)
    outcomes = asyncio.run(asyncio.wait_for(_burst(limited), 30))
    counted = refusals(limited) - before

    refused = {key: n for key, n in outcomes.items() if key[0] != "OK"}
    assert outcomes[("OK", True)] > 0, outcomes
    assert set(refused) <= {("UNAVAILABLE", True)}, outcomes
    assert counted == sum(refused.values()), outcomes
    assert_serves(limited)


async def _hold_streams(server: ServerProcess, count: int, release: asyncio.Event) -> None:
    """``count`` open streams, each answered once so the server surely holds it."""
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelStreamInfer() for _ in range(count)]
        for call in calls:  # one at a time: the model's queue is short
            await call.write(digits_request())
            answer = await call.read()
            assert answer.error_message == "", answer.error_message
        await release.wait()
        for call in calls:
            await call.done_writing()
        for call in calls:
            assert await call.code() == grpc.StatusCode.OK


async def _one_over_the_limit(server: ServerProcess) -> grpc.aio.AioRpcError:
    release = asyncio.Event()
    holder = asyncio.create_task(_hold_streams(server, MAX_CALLS, release))
    try:
        await asyncio.sleep(0)
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until the streams fill the limit
                try:
                    await stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
                except grpc.aio.AioRpcError as error:
                    return error
                await asyncio.sleep(0.05)
            raise AssertionError("no call was refused with MAX_CALLS streams open")
    finally:
        release.set()
        await holder


RESET_STREAMS = 200_000


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """grpc's limits as the server sets them by default. An empty repository."""
    server = start_server(tmp_path_factory.mktemp("empty_repo"))
    yield server
    assert server.stop() == 0


def _open_and_reset(first: int, count: int) -> bytes:
    """``count`` streams from ``first``, each a call opened and cancelled at once."""
    headers = grpc_call_headers("/inference.GRPCInferenceService/ServerLive")
    cancel = CANCEL.to_bytes(4, "big")
    return b"".join(
        frame(HEADERS, END_HEADERS, stream, headers) + frame(RST_STREAM, 0, stream, cancel)
        for stream in range(first, first + 2 * count, 2)
    )


def test_streams_opened_and_reset_at_once_cannot_grow_the_server(plain: ServerProcess) -> None:
    """HTTP/2 "rapid reset": a client opens calls and cancels them at once, costing it two
    frames each. Core queued every call the loop had not taken yet, with no bound: one
    connection had the server at 4.1 GB after 358,000 streams in 15 s, none of it returned
    (here 200,000 left it 2 GB larger)."""
    before = rss_mib(plain.process.pid)
    with socket.create_connection(("127.0.0.1", plain.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        sock.settimeout(30)
        for first in range(1, 2 * RESET_STREAMS, 200):
            sock.sendall(_open_and_reset(first, 100))
            if not _drain(sock):
                break  # closed by the server: as good as refused
    assert_serves_live(plain)  # after every stream above has been read
    grown = rss_mib(plain.process.pid) - before
    assert grown < 256, f"the server grew by {grown} MiB"  # 10,000 streams held: 125 MiB


def assert_serves_live(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=60).live


def test_calls_over_the_limit_are_refused_with_unavailable_and_counted(
    limited: ServerProcess,
) -> None:
    before = refusals(limited, reason="too_many_calls")
    error = asyncio.run(asyncio.wait_for(_one_over_the_limit(limited), 30))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"too many concurrent gRPC calls (limit {MAX_CALLS})" in (error.details() or "")
    assert refusals(limited, reason="too_many_calls") - before == 1
    assert_serves(limited)


# streams at shutdown ----------------------------------------------------------------------
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
"""Triton's words, from its gRPC stream handler."""


def test_an_idle_stream_does_not_hold_shutdown() -> None:
    """The stream has had its answer and waits for more: SIGTERM ends it at once, and the
    server exits without waiting out --shutdown-timeout (30 s)."""
    server = start_server(extra_args=["--shutdown-timeout", "30"])
    stop = threading.Event()

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        yield digits_request()
        stop.wait(60)  # open, and idle, until the test ends

    try:
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stream = stub.ModelStreamInfer(requests(), timeout=60)
            assert next(stream).error_message == ""
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as ended:
                next(stream)
            code = server.process.wait(30)
            seconds = time.monotonic() - started
    finally:
        stop.set()
        server.stop()
    assert code == 0
    assert seconds < 5, f"shutdown took {seconds:.1f} s with an idle stream open"
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ended.value.details() == SHUTTING_DOWN


def slow_request(iterations: int, request_id: str) -> service_pb2.ModelInferRequest:
    x = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    request = service_pb2.ModelInferRequest(model_name="slow", id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[1, WIDTH])
    request.inputs.add(name="iterations", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.extend([x.tobytes(), np.array([[iterations]], np.int64).tobytes()])
    return request


async def _busy_stream_at_shutdown(server: ServerProcess, seconds: float) -> list[object]:
    """One request running when SIGTERM comes, one sent after it: what the stream says."""
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        await stub.ModelInfer(slow_request(30, "calibrate"), timeout=30)
        per_iteration = (time.monotonic() - started) / 30
        call = stub.ModelStreamInfer()
        await call.write(slow_request(math.ceil(seconds / per_iteration), "running"))
        while metric(server, "batchserve_busy_instances", model="slow") < 1:
            await asyncio.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        await call.write(slow_request(1, "late"))
        said: list[object] = []
        with contextlib.suppress(grpc.aio.AioRpcError):  # how a stream that fails ends
            async for answer in call:
                said.append(answer.error_message or answer.infer_response)
        said.append((await call.code(), await call.details()))
        return said


def test_a_busy_stream_answers_its_requests_refuses_new_ones_then_ends(tmp_path: Path) -> None:
    write_slow_model(tmp_path, "slow", 4)
    server = start_server(tmp_path, ["--shutdown-timeout", "30"])
    started = time.monotonic()
    try:
        said = asyncio.run(asyncio.wait_for(_busy_stream_at_shutdown(server, 3.0), 40))
        code = server.process.wait(30)
    finally:
        server.stop()
    assert code == 0
    assert len(said) == 3, said
    late, running, end = said
    assert late == SHUTTING_DOWN
    assert isinstance(running, service_pb2.ModelInferResponse)
    assert running.id == "running"
    y = np.frombuffer(running.raw_output_contents[0], dtype=np.float32).reshape(1, WIDTH)
    np.testing.assert_allclose(y, expected(np.arange(WIDTH, dtype=np.float32)[None]), rtol=1e-6)
    assert end == (grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_messages_grpc_core_refuses_itself_are_counted_by_its_own_counters(workers: str) -> None:
    """A message over the size limit is refused by grpc core before any handler runs, so
    the server's refusal counter never sees it; core's call counters, exposed on the metrics
    port, do (with workers, each worker's core: the scrape asks them first)."""
    server = start_server(extra_args=["--max-binary-body-bytes", "100000", "--workers", workers])
    try:
        request = service_pb2.ModelInferRequest(model_name="digits_cnn")
        request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
        request.raw_input_contents.append(b"\0" * 200_000)
        failed = metric(server, "batchserve_grpc_core_calls_failed_total")
        refused = metric(server, "batchserve_refusals_total", protocol="grpc")
        codes = []
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as caught:
                    stub.ModelInfer(request, timeout=10)
                codes.append(caught.value.code())
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
        assert metric(server, "batchserve_grpc_core_calls_failed_total") == failed + 3
        assert metric(server, "batchserve_refusals_total", protocol="grpc") == refused
    finally:
        assert server.stop() == 0


def _wait_for_metric(server: ServerProcess, want: float, seconds: float, **labels: str) -> float:
    """The refusal count once it reaches ``want`` or ``seconds`` pass, whichever is first."""
    deadline = time.monotonic() + seconds
    while (seen := refusals(server, **labels)) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return seen


@pytest.mark.alone  # the early-closed connection must close between two looks of the watch
def test_connections_closed_at_the_handshake_deadline_are_counted() -> None:
    """grpc core closes a silent connection without telling the application; the count
    comes from watching channelz. A connection its client closes early, and one that made
    a call, are not refusals and are not counted: tritonclient's, closed when the silent
    ones are, lived as long as they did."""
    handshake_seconds = 3.0
    server = start_server(
        extra_args=["--grpc-handshake-timeout", str(int(handshake_seconds * 1000))]
    )
    try:
        assert_serves(server)  # made a call: never counted, whenever it closes
        client = tritongrpc.InferenceServerClient(server.grpc_url)
        image = tritongrpc.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(np.frombuffer(IMAGE, np.float32).reshape(1, 1, 8, 8))
        with contextlib.ExitStack() as stack:
            stack.callback(client.close)
            answer = client.infer("digits_cnn", [image])
            assert answer.as_numpy("logits").shape == (1, 10)
            silent = [
                stack.enter_context(socket.create_connection(("127.0.0.1", server.grpc_port)))
                for _ in range(3)
            ]
            with socket.create_connection(("127.0.0.1", server.grpc_port)):
                time.sleep(0.2)  # the client gives up long before the deadline
            seen = _wait_for_metric(server, 3, handshake_seconds + 10, reason="handshake_timeout")
            assert all(not _drain(sock) for sock in silent), "a silent socket is still open"
        assert seen == 3
        time.sleep(2 * 1.0 + 0.5)  # two more looks of the watch: nothing else is counted
        assert refusals(server, reason="handshake_timeout") == 3
        assert_serves(server)
    finally:
        assert server.stop() == 0
