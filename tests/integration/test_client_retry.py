"""batchserve_client's retries and timeouts: the schedule on a fake clock, then real sockets
(a closed port, a server that drops or ignores connections) and a real server answering 503."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from batchserve_client import (
    NO_RETRY,
    AsyncClient,
    BatchserveClientError,
    Client,
    ConnectionLost,
    DeadlineExceeded,
    InvalidArgument,
    RetryEvent,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
)
from batchserve_client.retry import Attempts, Retry, run

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

TOKEN = "retry-token"
NOT_SERVED = "model 'char_lstm' is not (loaded|ready)"
TOKENS = {"tokens": np.array([[5, 6, 7]]), "lengths": np.array([[3]])}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _attempts(policy: RetryPolicy, kind: Retry, timeout: float | None, clock: Clock) -> Attempts:
    """A schedule whose jitter always draws the top of its range."""
    return Attempts(policy, kind, timeout, clock=clock, uniform=lambda low, high: high)


def test_waits_grow_exponentially_up_to_the_cap_and_attempts_are_bounded() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.1, multiplier=2.0, max_backoff=0.3)
    attempts = _attempts(policy, Retry.UNAVAILABLE, None, Clock())
    delays = [attempts.after_failure(Unavailable("busy")) for _ in range(5)]
    assert delays == [0.1, 0.2, 0.3, 0.3, None]


def test_jitter_is_drawn_from_zero_to_the_cap() -> None:
    ranges: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        ranges.append((low, high))
        return low

    attempts = Attempts(RetryPolicy(initial_backoff=0.5), Retry.IDEMPOTENT, None, uniform=uniform)
    assert attempts.after_failure(Unavailable("busy")) == 0.0
    assert attempts.after_failure(Unavailable("busy")) == 0.0
    assert ranges == [(0.0, 0.5), (0.0, 1.0)]


def test_retry_after_is_a_floor_capped_by_max_backoff() -> None:
    clock = Clock()
    late = Unavailable("queue full", status=503, retry_after=1.0)
    patient = _attempts(
        RetryPolicy(initial_backoff=0.01, max_backoff=5.0), Retry.UNAVAILABLE, None, clock
    )
    assert patient.after_failure(late) == 1.0
    hasty = _attempts(
        RetryPolicy(initial_backoff=0.01, max_backoff=0.2), Retry.UNAVAILABLE, None, clock
    )
    assert hasty.after_failure(late) == 0.2


def test_no_wait_starts_that_would_pass_the_timeout() -> None:
    clock = Clock()
    policy = RetryPolicy(max_attempts=10, initial_backoff=0.3, multiplier=1.0)
    attempts = _attempts(policy, Retry.UNAVAILABLE, 1.0, clock)
    assert attempts.remaining() == 1.0
    assert attempts.after_failure(Unavailable("busy")) == 0.3
    clock.now = 0.8
    assert attempts.remaining() == pytest.approx(0.2)
    assert attempts.after_failure(Unavailable("busy")) is None
    clock.now = 1.0
    with pytest.raises(DeadlineExceeded, match=r"timeout of 1\.0 s has passed"):
        attempts.remaining()


@pytest.mark.parametrize(
    ("kind", "error", "retried"),
    [
        (Retry.NEVER, Unavailable("x"), False),
        (Retry.UNAVAILABLE, Unavailable("x"), True),
        (Retry.UNAVAILABLE, ConnectionLost("x"), False),
        (Retry.IDEMPOTENT, ConnectionLost("x"), True),
        (Retry.IDEMPOTENT, InvalidArgument("x"), False),
        (Retry.IDEMPOTENT, DeadlineExceeded("x"), False),
    ],
)
def test_which_errors_are_retried(kind: Retry, error: BatchserveClientError, retried: bool) -> None:
    attempts = _attempts(RetryPolicy(), kind, None, Clock())
    assert (attempts.after_failure(error) is not None) is retried


def test_run_retries_until_success_and_reports_each_retry() -> None:
    events: list[RetryEvent] = []
    policy = RetryPolicy(initial_backoff=0.001, on_retry=events.append)
    outcomes: list[Exception | str] = [Unavailable("one"), Unavailable("two"), "done"]

    def attempt(seconds: float | None) -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert run(attempt, Attempts(policy, Retry.UNAVAILABLE, 5.0)) == "done"
    assert [(e.attempt, e.error.message) for e in events] == [(1, "one"), (2, "two")]


def test_policies_are_checked() -> None:
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        RetryPolicy(max_attempts=0)


def _counting(max_attempts: int, **kwargs: float) -> tuple[RetryPolicy, list[RetryEvent]]:
    events: list[RetryEvent] = []
    policy = RetryPolicy(max_attempts=max_attempts, on_retry=events.append, **kwargs)
    return policy, events


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_refused_connection_is_retried_then_unavailable(scheme: str) -> None:
    policy, events = _counting(3, initial_backoff=0.01, max_backoff=0.02)
    url = f"{scheme}://127.0.0.1:{_free_port()}"
    with Client(url, retry=policy) as client, pytest.raises(Unavailable):
        client.model_metadata("digits_cnn")
    assert [event.attempt for event in events] == [1, 2]


@contextmanager
def _socket_server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A loopback listener handing each accepted connection to ``handle`` on a thread."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _drop(connection: socket.socket) -> None:
    """Read the request, then hang up without answering."""
    with connection:
        connection.recv(65536)


def _ignore(connection: socket.socket) -> None:
    """Keep the connection open and never answer."""
    with connection:
        connection.settimeout(5)
        while connection.recv(65536):
            pass


def test_a_dropped_connection_is_retried_only_for_idempotent_calls() -> None:
    with _socket_server(_drop) as port:
        policy, events = _counting(3, initial_backoff=0.01)
        with Client(f"http://127.0.0.1:{port}", retry=policy) as client:
            with pytest.raises(ConnectionLost):
                client.infer("digits_cnn", {"image": np.zeros((1, 1, 8, 8), np.float32)})
            assert events == []
            with pytest.raises(ConnectionLost):
                client.model_metadata("digits_cnn")
            assert [event.attempt for event in events] == [1, 2]


def test_a_silent_http_server_times_out() -> None:
    with _socket_server(_ignore) as port, Client(f"http://127.0.0.1:{port}") as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.model_metadata("digits_cnn", timeout=0.3)
        assert 0.3 <= time.monotonic() - start < 2.0


def test_a_grpc_connection_that_never_opens_ends_after_connect_timeout() -> None:
    """gRPC's own connection attempt lasts 20 s; connect_timeout shortens it."""
    with _socket_server(_ignore) as port:
        url = f"grpc://127.0.0.1:{port}"
        with Client(url, connect_timeout=0.3, retry=NO_RETRY, timeout=10) as client:
            start = time.monotonic()
            with pytest.raises(Unavailable, match="timed out"):
                client.is_live()
            assert time.monotonic() - start < 2.0


@pytest.fixture(scope="module")
def explicit_server() -> Iterator[ServerProcess]:
    """A server with model control on, digits_cnn loaded and char_lstm not: its infer is 503."""
    args = ["--model-control-mode", "explicit", "--load-model", "digits_cnn"]
    server = start_server(MODEL_REPO, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": TOKEN})
    yield server
    assert server.stop() == 0


def _urls(server: ServerProcess) -> list[str]:
    return [f"http://{server.http_url}", f"grpc://{server.grpc_url}"]


def test_503_is_retried_with_backoff_then_raised(explicit_server: ServerProcess) -> None:
    for url in _urls(explicit_server):
        policy, events = _counting(3, initial_backoff=0.05, max_backoff=0.05)
        with Client(url, retry=policy) as client, pytest.raises(Unavailable, match=NOT_SERVED):
            client.infer("char_lstm", TOKENS)
        assert [event.attempt for event in events] == [1, 2], url
        assert all(0 <= event.delay <= 0.05 for event in events)
        if url.startswith("http"):  # the server's Retry-After (1 s) is capped by max_backoff
            assert [event.error.retry_after for event in events] == [1.0, 1.0]
            assert [event.delay for event in events] == [0.05, 0.05]


def test_retry_after_is_honoured(explicit_server: ServerProcess) -> None:
    policy, events = _counting(2, initial_backoff=0.01, max_backoff=2.0)
    with Client(f"http://{explicit_server.http_url}", retry=policy) as client:
        start = time.monotonic()
        with pytest.raises(Unavailable):
            client.infer("char_lstm", TOKENS)
        assert time.monotonic() - start >= 1.0
    assert [event.delay for event in events] == [1.0]


def test_client_errors_are_never_retried(explicit_server: ServerProcess) -> None:
    for url in _urls(explicit_server):
        policy, events = _counting(4, initial_backoff=0.01)
        image = np.zeros((1, 8, 8), np.float32)
        with Client(url, retry=policy) as client, pytest.raises(InvalidArgument, match="image"):
            client.infer("digits_cnn", {"image": image})
        assert events == []


def test_a_retry_succeeds_once_the_model_is_loaded(explicit_server: ServerProcess) -> None:
    """The first retry loads the model (through a second client), so the next attempt runs."""
    admin = Client(f"http://{explicit_server.http_url}", token=TOKEN)

    def load_on_first_retry(event: RetryEvent) -> None:
        if event.attempt == 1:
            admin.load_model("char_lstm", timeout=120)

    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, on_retry=load_on_first_retry)
    try:
        with Client(f"grpc://{explicit_server.grpc_url}", retry=policy) as client:
            result = client.infer("char_lstm", TOKENS)
        assert result["next_char_logits"].shape == (1, 98)
    finally:
        admin.unload_model("char_lstm")
        admin.close()


def test_async_clients_retry_too(explicit_server: ServerProcess) -> None:
    async def main() -> None:
        for url in _urls(explicit_server):
            policy, events = _counting(3, initial_backoff=0.01, max_backoff=0.02)
            async with AsyncClient(url, retry=policy) as client:
                with pytest.raises(Unavailable, match=NOT_SERVED):
                    await client.infer("char_lstm", TOKENS)
            assert len(events) == 2, url

    asyncio.run(main())


def test_model_control_needs_the_token(explicit_server: ServerProcess) -> None:
    for url in _urls(explicit_server):
        with Client(url) as anonymous, Client(url, token=TOKEN) as admin:
            with pytest.raises(Unauthenticated, match="token"):
                anonymous.repository_index()
            # char_lstm was loaded and unloaded above; a model never loaded is listed by
            # name alone (REST leaves the state out, gRPC's field is empty), as in Triton
            states = {row["name"]: row.get("state", "") for row in admin.repository_index()}
            assert states == {
                "digits_cnn": "READY",
                "digits_cnn_uint8": "",
                "char_lstm": "UNAVAILABLE",
                "char_lstm_step": "",
                "simple_sequence": "",
                "char_lstm_generate": "",
                "repeat_int32": "",
                "square_int32": "",
            }
