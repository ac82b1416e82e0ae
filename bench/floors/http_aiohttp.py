"""The aiohttp echo floor (default asyncio loop, as the peers measured it).

python -m bench.floors.http_aiohttp [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from bench.floors.echo import HEADER_LENGTH, INFER_PATH, Echo

Handler = Callable[[web.Request], Awaitable[web.Response]]


def get_handler(echo: Echo, body: bytes | None) -> Handler:
    async def handle(_: web.Request) -> web.Response:
        data = echo.statistics() if body is None else body
        return web.Response(body=data, content_type="application/json") if data else web.Response()

    return handle


def infer_handler(echo: Echo) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        body, length = echo.infer(await request.read(), int(request.headers[HEADER_LENGTH]))
        headers = {HEADER_LENGTH: str(length), "Content-Type": "application/octet-stream"}
        return web.Response(body=body, headers=headers)

    return handle


async def serve(port: int) -> None:
    echo = Echo()
    app = web.Application(client_max_size=64 << 20)
    routes = [web.get(path, get_handler(echo, body)) for path, body in echo.get_routes().items()]
    app.add_routes([*routes, web.post(INFER_PATH, infer_handler(echo))])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="aiohttp v2 echo server")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
