"""The HTTP listeners: uvicorn, configured for inference serving and for the application's
own signal handling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from batchserve.core.addresses import host_port
from batchserve.core.errors import CannotStart
from batchserve.core.intake import Intake
from batchserve.core.settings import Settings
from batchserve.core.tls import TlsFiles
from batchserve.observability.refusals import Protocol
from batchserve.rest.http_limits import LimitedHttpToolsProtocol, protocol_for
from batchserve.rest.http_timeouts import ReadTimeouts

KEEP_ALIVE_SECONDS = 30
CLIENTS_POLL_SECONDS = 0.05
"""How often the stop looks whether the clients have closed their connections."""
WAITED_FOR_CLIENTS = "waited for HTTP clients to close their connections"
STOP_POLL_SECONDS = 0.005
"""How often a stopping listener looks whether its last connections have closed: a connection
told to shut down closes on the loop's next pass, so uvicorn's fixed 0.1 s waits were most of
a stop that found no client left."""
DATE_TICKS = 10
"""uvicorn's ``on_tick`` refreshes the Date header on every tenth count; counting by ten each
second keeps it refreshed once a second."""

logger = logging.getLogger(__name__)


class HttpListener(uvicorn.Server):
    """uvicorn without its own signal handling: the application owns SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, serves: Protocol) -> None:
        super().__init__(config)
        self.serves = serves
        self.sockets: list[socket.socket] | None = None
        """Sockets bound already (a port shared under ``--reuse-http-port``), served in
        place of the config's host and port."""
        self._stop_asked = asyncio.Event()

    def stop(self) -> None:
        """Stop listening now: what it accepted still has the graceful timeout."""
        self.should_exit = True
        self._stop_asked.set()

    async def main_loop(self) -> None:
        """uvicorn's, woken by ``stop`` at once rather than at its next 0.1 s tick (each
        listener's stop waited 50 ms on average for it, in turn)."""
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + DATE_TICKS) % (DATE_TICKS * 86_400)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_asked.wait(), timeout=1.0)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's: no new connection, each open one closed after its answer, then a wait
        for them and their tasks up to the graceful timeout (those left are cancelled); but
        polled every ``STOP_POLL_SECONDS`` where uvicorn sleeps 0.1 s first and between looks.
        On the 2-core reference machine a server's stop took 0.45 s, 0.2 s of it those sleeps
        on the HTTP and metrics listeners with no client left."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        state = self.server_state
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(STOP_POLL_SECONDS)
        except TimeoutError:
            logger.error("Cancel %s running task(s), timeout graceful shutdown exceeded",
                         len(state.tasks))  # fmt: skip
            for task in state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()  # (off here: a no-op, as uvicorn would call it)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's, but a start that fails (a port it cannot bind, whose reason it logs)
        raises CannotStart: its SystemExit would leave the event loop at once, with the
        server's other listeners still open."""
        try:
            await super().serve(sockets or self.sockets)
        except SystemExit:
            where = self.config.uds or host_port(self.config.host, self.config.port)
            name = "HTTP" if self.serves is Protocol.HTTP else "metrics"
            raise CannotStart(f"cannot serve {name} on {where} (why: above)") from None

    def bound_port(self) -> int:
        return int(self.servers[0].sockets[0].getsockname()[1])

    async def wait_for_clients(self, deadline: float) -> None:
        """Until the clients have closed every connection made before the stop, or the event
        loop's clock reaches ``deadline``, as Triton's HTTP service waits at its stop, in its
        words each second. Meanwhile those connections are served, each closed after its
        next answer (``LimitedHttpToolsProtocol.close_after_answer``, called here for one
        answering already), and new ones closed unanswered; an idle one is closed by the
        keep-alive timer at the latest."""
        for connection in list(self.server_state.connections):
            if isinstance(connection, LimitedHttpToolsProtocol):
                connection.close_after_answer()
        loop = asyncio.get_running_loop()
        began = say_at = loop.time()
        if not self.server_state.connections:
            return
        while self.server_state.connections and (now := loop.time()) < deadline:
            if now >= say_at:
                logger.info("Timeout %d: Found %d HTTP service connections",
                            round(deadline - now), len(self.server_state.connections))  # fmt: skip
                say_at += 1.0
            await asyncio.sleep(CLIENTS_POLL_SECONDS)
        left = len(self.server_state.connections)  # the listener's stop closes them
        logger.log(logging.WARNING if left else logging.INFO, WAITED_FOR_CLIENTS,
                   extra={"seconds": round(loop.time() - began, 2), "left_open": left})  # fmt: skip


def http_listener(
    app: Any,
    settings: Settings,
    port: int,
    listener: Protocol,
    tls: TlsFiles | None = None,
    uds: str | None = None,
    intake: Intake | None = None,
) -> HttpListener:
    """A uvicorn server on ``port`` (or the Unix socket ``uds``), serving TLS when ``tls``
    is given; its refusals are counted under ``listener``; no new connection once
    ``intake`` has closed."""
    timeouts = ReadTimeouts(
        settings.http_header_timeout_seconds,
        settings.http_body_timeout_seconds,
        settings.http_body_min_rate,
    )
    config = uvicorn.Config(
        app,
        host=settings.metrics_host() if listener is Protocol.METRICS else settings.http_host(),
        port=port,
        uds=uds,
        loop="none",
        http=protocol_for(listener, timeouts, intake, settings.http_send_timeout_seconds),
        ws="none",  # no route is a WebSocket: an offer to switch is declined (rest/upgrades.py)
        lifespan="off",
        access_log=False,
        log_config=None,
        # Nothing reads the client's address; rewriting it from X-Forwarded-* headers
        # took ~2.5 % of the event loop under load.
        proxy_headers=False,
        server_header=False,
        # Longer than clients keep idle connections (httpx and batchserve_client: 5 s),
        # so a client never reuses a connection the server is closing at that moment.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds),
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    return HttpListener(config, listener)
