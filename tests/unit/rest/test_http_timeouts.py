"""Read timeouts of the server's HTTP protocol (the real class, fed real bytes), on a clock
the test moves by hand: no test waits for a timeout to pass."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import uvicorn
from batchserve.core.intake import Intake
from batchserve.observability.refusals import REFUSALS, Protocol, Reason
from batchserve.rest.http_limits import MAX_CHUNKS, LimitedHttpToolsProtocol, protocol_for
from batchserve.rest.http_timeouts import SHUTDOWN_BODY_GRACE_SECONDS, ReadTimeouts
from uvicorn.server import ServerState

pytestmark = pytest.mark.anyio

TIMEOUTS = ReadTimeouts(header_seconds=20, body_seconds=20, body_min_rate=500)
HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"


class ManualTimer:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClockLoop:
    """The protocol's event loop: timers on a clock the test advances; everything else (the
    application's task, the transport's flush) on the real loop."""

    def __init__(self, real: asyncio.AbstractEventLoop) -> None:
        self.real = real
        self.now = 1000.0
        self.timers: list[ManualTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> ManualTimer:
        timer = ManualTimer(when, callback)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> ManualTimer:
        return self.call_at(self.now + delay, callback)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        return self.real.call_soon(callback, *args)

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        return self.real.create_task(coro, **kwargs)

    def advance(self, seconds: float) -> None:
        """Move the clock, firing each timer due on the way at its own time."""
        end = self.now + seconds
        while due := [t for t in self.timers if not t.cancelled and t.when <= end]:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.now = end

    def stall(self, seconds: float) -> None:
        """The loop is held up: time passes, nothing runs; then the timers due run once,
        before any read that arrived meanwhile (as libuv runs them)."""
        self.now += seconds
        for timer in [t for t in self.timers if not t.cancelled and t.when <= self.now]:
            self.timers.remove(timer)
            timer.callback()


class SinkTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closing = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def writelines(self, list_of_data: Any) -> None:
        self.written += b"".join(bytes(part) for part in list_of_data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 9) if name in ("peername", "sockname") else default


class ReadingApp:
    """Reads the whole body once ``may_read`` is set, then answers 200."""

    def __init__(self, read_at_once: bool = True) -> None:
        self.may_read = asyncio.Event()
        if read_at_once:
            self.may_read.set()
        self.saw_disconnect = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await self.may_read.wait()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.saw_disconnect = True
                return
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})


class Connection:
    def __init__(
        self,
        app: ReadingApp,
        timeouts: ReadTimeouts = TIMEOUTS,
        listener: Protocol = Protocol.HTTP,
        intake: Intake | None = None,
    ) -> None:
        self.loop = ManualClockLoop(asyncio.get_running_loop())
        config = uvicorn.Config(app, lifespan="off", log_config=None, proxy_headers=False,
                                timeout_keep_alive=30)  # fmt: skip
        config.load()
        protocol_class = protocol_for(listener, timeouts, intake)
        self.protocol: LimitedHttpToolsProtocol = protocol_class(
            config=config, server_state=ServerState(), app_state={}, _loop=self.loop
        )
        self.transport = SinkTransport()
        self.protocol.connection_made(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    @property
    def closed(self) -> bool:
        return self.transport.closing

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = self.transport.written.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines)
        return int(status_line.split()[1]), headers, body


async def _settle() -> None:
    """Let the application's task run until it waits again."""
    for _ in range(10):
        await asyncio.sleep(0)


def _refused(listener: Protocol, reason: Reason) -> int:
    return REFUSALS.snapshot().get((listener, reason), 0)


async def test_a_silent_connection_is_closed_without_an_answer_at_the_header_timeout() -> None:
    before = _refused(Protocol.METRICS, Reason.HEADER_TIMEOUT)
    connection = Connection(ReadingApp(), listener=Protocol.METRICS)
    connection.loop.advance(19.9)
    assert not connection.closed
    connection.loop.advance(0.2)
    assert connection.closed
    assert connection.transport.written == b""
    assert _refused(Protocol.METRICS, Reason.HEADER_TIMEOUT) == before + 1


async def test_a_head_not_whole_at_the_header_timeout_is_408() -> None:
    before = _refused(Protocol.HTTP, Reason.HEADER_TIMEOUT)
    connection = Connection(ReadingApp())
    for byte in b"GET /v2/health/ready HTTP/1.1\r\n":  # one byte a second
        if connection.closed:
            break
        connection.send(bytes([byte]))
        connection.loop.advance(1)
    assert connection.loop.now - 1000 == 20  # closed at the 20th second, not later
    status, headers, body = connection.answer()
    assert status == 408
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert "20 s" in json.loads(body)["error"]
    assert _refused(Protocol.HTTP, Reason.HEADER_TIMEOUT) == before + 1


async def test_the_header_clock_of_a_later_request_starts_at_its_first_byte() -> None:
    """Between requests only uvicorn's keep-alive timeout (here 30 s) runs."""
    connection = Connection(ReadingApp())
    connection.send(HEAD % 2 + b"\r\n{}")
    await _settle()
    assert connection.answer()[0] == 200
    connection.transport.written = b""
    connection.loop.advance(25)  # idle: longer than the header timeout, shorter than keep-alive
    assert not connection.closed
    connection.send(b"GET /v2/health/ready HT")
    connection.loop.advance(19.9)
    assert not connection.closed
    connection.loop.advance(0.2)
    assert connection.answer()[0] == 408


async def test_a_request_that_waited_behind_a_stalled_loop_is_not_the_clients_fault() -> None:
    connection = Connection(ReadingApp())
    connection.loop.stall(30)  # the request arrived at once, but nothing read it for 30 s
    assert not connection.closed
    connection.send(HEAD % 2 + b"\r\n{}")
    await _settle()
    connection.loop.advance(1)
    assert connection.answer()[0] == 200
    assert not connection.closed


async def test_a_body_must_arrive_within_its_timeout_plus_one_second_per_min_rate_bytes() -> None:
    before = _refused(Protocol.HTTP, Reason.BODY_TIMEOUT)
    app = ReadingApp()
    connection = Connection(app)
    connection.send(HEAD % 100_000 + b"\r\n")
    connection.send(b" " * 5000)  # earns 10 s: the deadline is 30 s from the head
    await _settle()
    connection.loop.advance(29.9)
    assert not connection.closed
    connection.loop.advance(0.2)
    status, headers, body = connection.answer()
    assert status == 408
    assert headers["connection"] == "close"
    assert "request body" in json.loads(body)["error"]
    await _settle()
    assert app.saw_disconnect  # the route waiting for the body was told, and answered nothing
    assert connection.transport.written.count(b"HTTP/1.1") == 1
    assert _refused(Protocol.HTTP, Reason.BODY_TIMEOUT) == before + 1


async def test_an_upload_at_the_minimum_rate_is_never_cut_off() -> None:
    app = ReadingApp()
    connection = Connection(app)
    connection.send(HEAD % 50_000 + b"\r\n")
    for _ in range(100):  # 500 bytes a second for 100 s: five times the body timeout
        connection.send(b" " * 500)
        connection.loop.advance(1)
        await _settle()
        assert not connection.closed
    assert connection.answer()[0] == 200


async def test_data_never_touches_the_timer() -> None:
    """One timer for the whole connection: armed when it opens, not per chunk received."""
    connection = Connection(ReadingApp())
    connection.send(HEAD % 10_000 + b"\r\n")
    for _ in range(100):
        connection.send(b" " * 100)
    await _settle()
    assert connection.answer()[0] == 200
    ours = [t for t in connection.loop.timers if getattr(t.callback, "__name__", "") == "_on_timer"]
    assert len(ours) == 1


async def test_time_the_application_holds_reading_paused_is_not_the_clients() -> None:
    app = ReadingApp(read_at_once=False)
    fast = ReadTimeouts(header_seconds=20, body_seconds=20, body_min_rate=1e12)
    connection = Connection(app, fast)
    connection.send(HEAD % 200_000 + b"\r\n")
    connection.send(b" " * 100_000)  # past uvicorn's high-water mark: it stops reading
    assert not connection.transport.reading
    connection.loop.advance(100)
    assert not connection.closed
    app.may_read.set()  # the application reads: reading resumes after 100 s paused
    await _settle()
    assert connection.transport.reading
    connection.loop.advance(19.9)  # 20 s of the client's own time, then the deadline
    assert not connection.closed
    connection.loop.advance(0.2)
    assert connection.answer()[0] == 408


async def test_waiting_for_100_continue_is_not_the_clients_time() -> None:
    app = ReadingApp(read_at_once=False)
    connection = Connection(app)
    connection.send(HEAD % 10 + b"expect: 100-continue\r\n\r\n")
    connection.loop.advance(100)  # the application has not asked for the body yet
    assert not connection.closed
    app.may_read.set()
    await _settle()
    assert connection.transport.written == b"HTTP/1.1 100 Continue\r\n\r\n"
    connection.send(b"0123456789")
    await _settle()
    assert connection.transport.written.count(b"HTTP/1.1 200 OK") == 1


async def test_at_shutdown_a_body_still_arriving_gets_503_after_the_grace() -> None:
    before = _refused(Protocol.HTTP, Reason.UNAVAILABLE)
    arriving = Connection(ReadingApp())
    arriving.send(HEAD % 10 + b"\r\n01234")
    whole = Connection(ReadingApp(read_at_once=False))
    whole.send(HEAD % 10 + b"\r\n0123456789")
    await _settle()
    arriving.protocol.shutdown()
    whole.protocol.shutdown()
    arriving.loop.advance(SHUTDOWN_BODY_GRACE_SECONDS - 0.1)
    assert arriving.transport.written == b""  # a body on the wire may still finish
    arriving.loop.advance(0.2)
    status, headers, body = arriving.answer()
    assert (status, headers["connection"]) == (503, "close")
    assert json.loads(body) == {"error": "server is shutting down"}
    assert not whole.closed
    whole_app = whole.protocol.app
    assert isinstance(whole_app, ReadingApp)
    whole_app.may_read.set()
    await _settle()
    status, headers, _ = whole.answer()
    assert (status, headers["connection"]) == (200, "close")
    assert _refused(Protocol.HTTP, Reason.UNAVAILABLE) == before + 1


async def test_a_connection_made_once_the_intake_has_closed_is_closed_unanswered() -> None:
    """Triton resets a connection made once its stop has begun; one made before is served."""
    before = _refused(Protocol.HTTP, Reason.UNAVAILABLE)
    intake = Intake()
    before_stop = Connection(ReadingApp(), intake=intake)
    intake.close()
    after_stop = Connection(ReadingApp(), intake=intake)
    assert after_stop.closed
    assert after_stop.transport.written == b""
    assert not before_stop.closed
    assert _refused(Protocol.HTTP, Reason.UNAVAILABLE) == before + 1
    metrics = Connection(ReadingApp(), listener=Protocol.METRICS)  # a listener without one
    assert not metrics.closed


async def test_once_the_intake_has_closed_an_older_connection_is_served_and_closed_after() -> None:
    """Triton keeps serving a connection made before its stop; each answer on it from then
    on says ``Connection: close``, and the connection closes after it."""
    intake = Intake()
    connection = Connection(ReadingApp(), intake=intake)
    connection.send(HEAD % 2 + b"\r\nok")
    await _settle()
    status, headers, _ = connection.answer()
    assert status == 200
    assert "connection" not in headers
    assert not connection.closed
    connection.transport.written = b""
    intake.close()
    connection.send(HEAD % 2 + b"\r\nok")
    await _settle()
    status, headers, body = connection.answer()
    assert (status, headers["connection"], body) == (200, "close", b"ok")
    assert connection.closed


async def test_the_request_being_served_as_the_wait_for_clients_begins_closes_after_it() -> None:
    """Read before the intake closed, its answer still closes the connection; an idle
    connection is left open for its client's next request."""
    app = ReadingApp(read_at_once=False)
    busy = Connection(app)
    busy.send(HEAD % 2 + b"\r\nok")
    await _settle()
    busy.protocol.close_after_answer()
    app.may_read.set()
    await _settle()
    status, headers, _ = busy.answer()
    assert (status, headers["connection"]) == (200, "close")
    assert busy.closed
    idle = Connection(ReadingApp())
    idle.protocol.close_after_answer()
    assert not idle.closed


async def test_at_shutdown_a_body_that_finishes_within_the_grace_is_served() -> None:
    connection = Connection(ReadingApp())
    connection.send(HEAD % 10 + b"\r\n01234")
    await _settle()
    connection.protocol.shutdown()
    connection.loop.advance(SHUTDOWN_BODY_GRACE_SECONDS / 2)
    connection.send(b"56789")
    await _settle()
    connection.loop.advance(SHUTDOWN_BODY_GRACE_SECONDS)
    status, headers, body = connection.answer()
    assert (status, headers["connection"], body) == (200, "close", b"ok")


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /v2 HTTP/1.1\r\nhost: x\r\nbad header: y\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello on the plain port
        HEAD.replace(b"content-length: %d", b"transfer-encoding: chunked") + b"\r\nzz\r\n",
    ],
    ids=["header name", "request line", "chunk size"],
)
async def test_a_request_that_does_not_parse_is_a_json_400(request_: bytes) -> None:
    before = _refused(Protocol.HTTP, Reason.MALFORMED)
    connection = Connection(ReadingApp())
    connection.send(request_)
    await _settle()
    status, headers, body = connection.answer()
    assert (status, headers["connection"]) == (400, "close")
    assert headers["content-type"] == "application/json"
    assert "malformed" in json.loads(body)["error"]
    assert connection.closed
    assert _refused(Protocol.HTTP, Reason.MALFORMED) == before + 1


async def test_an_oversized_head_on_the_metrics_port_is_counted_as_the_metrics_ones() -> None:
    before = _refused(Protocol.METRICS, Reason.HEAD_TOO_LARGE)
    connection = Connection(ReadingApp(), listener=Protocol.METRICS)
    connection.send(b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-big: " + b"x" * 40_000 + b"\r\n\r\n")
    assert connection.answer()[0] == 431
    assert _refused(Protocol.METRICS, Reason.HEAD_TOO_LARGE) == before + 1


CHUNKED = HEAD.replace(b"content-length: %d", b"transfer-encoding: chunked") + b"\r\n"


async def test_trailers_within_the_head_limits_are_read_and_the_request_served() -> None:
    connection = Connection(ReadingApp())
    trailers = b"".join(b"x-t%d: %s\r\n" % (i, b"v" * 200) for i in range(20))
    connection.send(CHUNKED + b"5\r\nhello\r\n0\r\n" + trailers + b"\r\n")
    await _settle()
    assert connection.answer()[0] == 200
    assert not connection.closed


async def test_chunks_whose_data_comes_in_the_read_after_their_size_are_not_trailers() -> None:
    """Each read that begins just after a size line is counted until data shows it is no
    trailer: 200 such reads of 4 KiB add up to 800 KiB, far past the limit, and must not."""
    connection = Connection(ReadingApp())
    connection.send(CHUNKED)
    for _ in range(200):
        connection.send(b"ffe\r\n")
        connection.send(b"d" * 0xFFE + b"\r\n")
    connection.send(b"0\r\n\r\n")
    await _settle()
    assert connection.answer()[0] == 200
    assert not connection.closed


async def test_a_trailer_line_that_never_ends_is_431_before_it_is_whole() -> None:
    """httptools joins the pieces of a header value with ``bytes +=``: a trailer of megabytes
    held one connection's event loop for seconds, its cost growing with the square of its size.
    The head's limit applies to the trailers, counted on the bytes received."""
    before = _refused(Protocol.HTTP, Reason.HEAD_TOO_LARGE)
    app = ReadingApp()
    connection = Connection(app)
    connection.send(CHUNKED + b"5\r\nhello\r\n")
    connection.send(b"0\r\nx-endless: ")
    fed = 0
    while fed < 8 * 1024 * 1024 and not connection.closed:
        connection.send(b"x" * 4096)
        fed += 4096
    await _settle()
    assert fed <= 40 * 1024, f"{fed} bytes of one trailer line were read"
    status, headers, body = connection.answer()
    assert (status, headers["connection"]) == (431, "close")
    assert "trailers" in json.loads(body)["error"]
    assert app.saw_disconnect
    assert _refused(Protocol.HTTP, Reason.HEAD_TOO_LARGE) == before + 1


@pytest.mark.parametrize(
    ("trailers", "fragment"),
    [
        (b"".join(b"x-t%d: v\r\n" % i for i in range(101)), "headers"),
        (b"".join(b"x-t%d: %s\r\n" % (i, b"v" * 1000) for i in range(40)), "bytes"),
    ],
    ids=["101 trailers", "40 KB of trailers"],
)
async def test_trailers_count_against_the_head_limits(trailers: bytes, fragment: str) -> None:
    connection = Connection(ReadingApp())
    connection.send(CHUNKED + b"5\r\nhello\r\n0\r\n" + trailers + b"\r\n")
    await _settle()
    status, _, body = connection.answer()
    assert status == 431
    assert fragment in json.loads(body)["error"]
    assert connection.closed


@pytest.mark.parametrize("chunks", [MAX_CHUNKS, MAX_CHUNKS + 1])
async def test_a_chunked_body_may_have_tritons_count_of_chunks(chunks: int) -> None:
    """Each chunk costs the parser's callbacks whatever its size: 4 MiB sent a byte a chunk
    held the event loop for 10.9 s. Past Triton's count: its answer, 400 in its words."""
    before = _refused(Protocol.HTTP, Reason.BODY_TOO_LARGE)
    app = ReadingApp()
    connection = Connection(app)
    connection.send(CHUNKED)
    body = b"1\r\nx\r\n" * chunks + b"0\r\n\r\n"
    for start in range(0, len(body), 65536):
        if connection.closed:
            break
        connection.send(body[start : start + 65536])
    await _settle()
    status, headers, answer = connection.answer()
    if chunks == MAX_CHUNKS:
        assert (status, connection.closed) == (200, False)
        assert _refused(Protocol.HTTP, Reason.BODY_TOO_LARGE) == before
        return
    assert (status, headers["connection"]) == (400, "close")
    assert json.loads(answer)["error"] == (
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger "
        "HTTP chunks."
    )
    assert app.saw_disconnect
    assert _refused(Protocol.HTTP, Reason.BODY_TOO_LARGE) == before + 1
