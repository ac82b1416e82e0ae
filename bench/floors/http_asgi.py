"""The raw-ASGI echo floor: a bare ASGI callable on uvicorn with uvloop and httptools.

python -m bench.floors.http_asgi [--port 0]
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

import uvicorn

from bench.floors.echo import INFER_PATH, Echo

Message = dict[str, Any]
Receive = Any
Send = Any
JSON = (b"content-type", b"application/json")


class EchoApp:
    def __init__(self) -> None:
        self.echo = Echo()
        self.routes = self.echo.get_routes()

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "POST" and scope["path"] == INFER_PATH:
            await self.infer(scope, receive, send)
        elif scope["method"] == "GET" and scope["path"] in self.routes:
            body = self.routes[scope["path"]]
            await respond(send, 200, self.echo.statistics() if body is None else body, [JSON])
        else:
            await respond(send, 404, b"", [])

    async def infer(self, scope: Message, receive: Receive, send: Send) -> None:
        length = next(v for k, v in scope["headers"] if k == b"inference-header-content-length")
        body, header_length = self.echo.infer(await read_body(receive), int(length))
        headers = [(b"content-type", b"application/octet-stream"),
                   (b"inference-header-content-length", str(header_length).encode())]  # fmt: skip
        await respond(send, 200, body, headers)


async def read_body(receive: Receive) -> bytes:
    message = await receive()
    chunks = [message.get("body", b"")]
    while message.get("more_body"):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description="raw ASGI v2 echo server on uvicorn")
    parser.add_argument("--port", type=int, default=0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", parser.parse_args().port))
    config = uvicorn.Config(EchoApp(), loop="uvloop", http="httptools", lifespan="off",
                            access_log=False, log_level="warning")  # fmt: skip
    print(f"READY {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
