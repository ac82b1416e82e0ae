"""A request in flight learns that its client went away: from the server's own protocol
(the real uvicorn protocol class, fed real bytes), or by watching ``receive()`` elsewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from batchserve.rest.disconnect import ClientDisconnected, until_disconnect
from batchserve.rest.http_limits import LimitedHttpToolsProtocol
from uvicorn.server import ServerState

pytestmark = pytest.mark.anyio

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


class SinkTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.written.extend(bytes(part) for part in list_of_data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 9) if name in ("peername", "sockname") else default


class Recorder:
    """An ASGI app whose inference never finishes on its own."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.outcome: str | None = None
        self.work: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        self.started.set()
        try:
            await until_disconnect(self.work, receive)
        except ClientDisconnected:
            self.outcome = "disconnected"
            return
        self.outcome = "answered"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _connect(app: Recorder) -> tuple[LimitedHttpToolsProtocol, SinkTransport]:
    config = uvicorn.Config(app, lifespan="off", log_config=None, proxy_headers=False)
    protocol = LimitedHttpToolsProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = SinkTransport()
    protocol.connection_made(transport)
    protocol.data_received(REQUEST)
    return protocol, transport


async def test_a_lost_connection_cancels_the_inference_in_flight() -> None:
    app = Recorder()
    protocol, _ = _connect(app)
    await asyncio.wait_for(app.started.wait(), 5)
    protocol.connection_lost(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert app.work.cancelled()  # its place in the queue is freed at once
    assert app.outcome == "disconnected"


async def test_an_answered_request_is_not_cancelled_when_the_client_leaves_later() -> None:
    app = Recorder()
    protocol, transport = _connect(app)
    await asyncio.wait_for(app.started.wait(), 5)
    app.work.set_result(None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert app.outcome == "answered"
    assert any(part.startswith(b"HTTP/1.1 200") for part in transport.written)
    protocol.connection_lost(None)
    await asyncio.sleep(0)
    assert app.outcome == "answered"


async def test_a_connection_lost_before_the_inference_starts_never_runs_it() -> None:
    app = Recorder()
    started = []

    async def work() -> None:
        started.append(True)

    async def late(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        protocol.connection_lost(None)  # gone while the request was being decoded
        try:
            await until_disconnect(work(), receive)
        except ClientDisconnected:
            app.outcome = "disconnected"

    config = uvicorn.Config(late, lifespan="off", log_config=None)
    protocol = LimitedHttpToolsProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    protocol.connection_made(SinkTransport())
    protocol.data_received(REQUEST)
    for _ in range(5):
        await asyncio.sleep(0)
    assert app.outcome == "disconnected"
    assert started == []


async def test_under_another_server_receive_is_watched() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    work: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(until_disconnect(work, receive))
    await asyncio.sleep(0)
    gone.set()
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(waiting, 5)
    assert work.cancelled()
