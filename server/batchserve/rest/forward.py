"""A worker's HTTP requests that the model-owning process answers: every route but
inference goes there whole, streamed over a Unix socket (``h11``, the HTTP/1.1 engine
uvicorn itself runs on); inference does too for a model the worker does not know yet.
The client's address travels in a header that only the model-owning process's own
listener (``trusting_peer_header``) believes."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import h11

from batchserve.core.errors import Unavailable
from batchserve.core.settings import Settings
from batchserve.dataplane.inference_path import KnownModels
from batchserve.rest.errors import error_body, error_headers
from batchserve.rest.infer import (
    ASGIApp,
    InferEndpoint,
    Message,
    Receive,
    Scope,
    Send,
    path_segment,
)

PEER_HEADER = b"x-batchserve-peer"
READ_SIZE = 1 << 16
IDLE_REUSE_S = 10.0
"""An idle connection is reused only this long: well inside the listener's keep-alive, so
it is never one the other side is closing."""
_HOP_BY_HOP = frozenset(
    (b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"trailer",
     b"proxy-connection", PEER_HEADER)
)  # fmt: skip
_SET_HERE = _HOP_BY_HOP | {b"date"}
"""Headers of the model-owning process's answer left out: this worker's server writes its
own ``date``, and a second one (RFC 9110 allows one) went to every forwarded answer."""


class _Connection:
    """One keep-alive HTTP/1.1 connection to the model-owning process."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.left = False
        """The client went away while this connection carried its request."""

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def next_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(READ_SIZE))
                continue
            assert not isinstance(event, type)  # PAUSED never comes to a client here
            return event

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.close()


class HttpForwarder:
    """An ASGI app answering each request with the model-owning process's answer to it."""

    def __init__(self, socket_path: str) -> None:
        self._path = socket_path
        self._idle: list[_Connection] = []

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.idle_since < IDLE_REUSE_S and not connection.reader.at_eof():
                return connection
            connection.close()
        reader, writer = await asyncio.open_unix_connection(self._path)
        return _Connection(reader, writer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            connection = await self._connection()
        except OSError as exc:
            await _unavailable(send, exc)
            return
        body: asyncio.Task[None] | None = None
        try:
            await self._head(connection, scope)
            # The body goes on while the answer is read: the other side may answer first
            # (a refused token, a body too large) and the client waits for that answer.
            body = asyncio.create_task(self._body(connection, receive))
            await self._response(connection, sending)
        except (OSError, h11.ProtocolError) as exc:
            connection.close()
            if connection.left:
                return  # the client went first: nobody to tell
            if started or isinstance(exc, ConnectionAbortedError):
                raise  # the client's connection closes: nothing else can be said
            await _unavailable(send, exc)
            return
        except BaseException:
            connection.close()
            raise
        finally:
            if body is not None and not body.done():
                body.cancel()
                await asyncio.wait((body,))
        if connection.reusable():
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()

    async def _head(self, connection: _Connection, scope: Scope) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP]
        if not any(k == b"content-length" for k, _ in headers):
            headers.append((b"transfer-encoding", b"chunked"))
        client = scope.get("client")
        headers.append((PEER_HEADER, str(client[0]).encode() if client else b""))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        await connection.send(h11.Request(method=scope["method"], target=target, headers=headers))

    async def _body(self, connection: _Connection, receive: Receive) -> None:
        """Send the body, then watch for the client leaving while the answer comes (a
        stream of server-sent events runs until the client goes)."""
        sent = False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                connection.left = True
                connection.close()  # the answer being read fails: nobody waits for it
                return
            if sent:
                continue
            body = message.get("body", b"")
            if body:
                await connection.send(h11.Data(data=body))
            if not message.get("more_body", False):
                await connection.send(h11.EndOfMessage())
                sent = True

    async def _response(self, connection: _Connection, send: Send) -> None:
        event = await connection.next_event()
        while isinstance(event, h11.InformationalResponse):
            event = await connection.next_event()
        if not isinstance(event, h11.Response):
            raise ConnectionError(f"unexpected answer from the model-owning process: {event}")
        headers = [(k, v) for k, v in event.headers if k not in _SET_HERE]
        await send({"type": "http.response.start", "status": event.status_code,
                    "headers": headers})  # fmt: skip
        while True:
            event = await connection.next_event()
            if isinstance(event, h11.Data):
                await send({"type": "http.response.body", "body": bytes(event.data),
                            "more_body": True})  # fmt: skip
            elif isinstance(event, h11.EndOfMessage):
                await send({"type": "http.response.body", "body": b""})
                return
            else:
                raise ConnectionError(f"unexpected answer from the model-owning process: {event}")

    def close(self) -> None:
        for connection in self._idle:
            with contextlib.suppress(OSError):
                connection.close()
        self._idle.clear()


async def _unavailable(send: Send, cause: BaseException) -> None:
    """503: the model-owning process did not answer (it is restarting the pod, or gone)."""
    error = Unavailable(f"the model-owning process cannot be reached: {cause}")
    status, body = error_body(error)
    await send({"type": "http.response.start", "status": status, "headers": error_headers(error)})
    await send({"type": "http.response.body", "body": body})


def trusting_peer_header(app: ASGIApp) -> ASGIApp:
    """The model-owning process's listener: each request's client is the one its worker
    names (the listener is a Unix socket only the server's own processes reach)."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        for key, value in scope.get("headers", ()):
            if key == PEER_HEADER:
                scope["client"] = (value.decode("latin-1"), 0) if value else None
                break
        await app(scope, receive, send)

    return call


class WorkerInferEndpoint(InferEndpoint):
    """Inference decoded in the worker, unless the worker does not know the model yet."""

    def __init__(self, plane: KnownModels, settings: Settings, forwarder: HttpForwarder) -> None:
        super().__init__(plane, settings)
        self.plane = plane
        self.forwarder = forwarder

    async def answer(
        self, scope: Scope, receive: Receive, send: Send, match: re.Match[bytes]
    ) -> None:
        name, version = path_segment(match[1]), path_segment(match[2] or b"")
        if self.plane.knows(name, version) or await self.plane.learn(name, version):
            await super().answer(scope, receive, send, match)
        else:
            await self.forwarder(scope, receive, send)
