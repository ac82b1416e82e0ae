"""A request-handling worker (``--workers N``): serves its share of the HTTP and gRPC ports,
decodes and validates inference requests, and hands them to the model-owning process;
every other call it forwards there whole.

Forked by the fork server (``fork_server``), or started afresh by ``worker_pool`` as
``python -m batchserve.runtime.worker_process FD`` where workers cannot be forked: FD is its
end of the socket to the model-owning process, whose first frame says what to serve.
Stop signals are the model-owning process's to act on (a terminal's Ctrl-C reaches the
whole process group): the worker drains when that process says so, and exits at once,
non-zero, when that process is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Sequence
from functools import partial

import uvloop

from batchserve.core.request_memory import RequestMemory
from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.frames import Frame, read_frame
from batchserve.dataplane.handoff.intake_word import worker_intake
from batchserve.dataplane.handoff.worker_plane import WorkerPlane
from batchserve.devices.host_memory import cpu_total_bytes
from batchserve.grpc.server import WorkerGrpcServer
from batchserve.observability.grpc_core_counts import read_core_call_counts
from batchserve.observability.logs import configure_logging
from batchserve.observability.refusals import REFUSALS, Protocol
from batchserve.rest.forward import HttpForwarder, WorkerInferEndpoint
from batchserve.rest.infer import in_front_of
from batchserve.rest.restricted import restricted
from batchserve.runtime import cpu_scheduling, gc_tuning, malloc_tuning
from batchserve.runtime.event_loop import BoundedHandshakeLoop
from batchserve.runtime.fork_server import WORKER_NAME, WORKER_TITLE, die_with_parent, name_process
from batchserve.runtime.http_listener import http_listener
from batchserve.runtime.shared_ports import reuse_port_socket
from batchserve.runtime.stop_signals import SIGNALS as STOP_SIGNALS
from batchserve.runtime.worker_counts import counts_frame

logger = logging.getLogger(__name__)


class _Start:
    """The first frame: what this worker serves and where its arenas are."""

    def __init__(self, sock: socket.socket) -> None:
        def read_exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = sock.recv(n - len(data))
                if not chunk:
                    raise ConnectionError("the model-owning process closed the socket")
                data += chunk
            return data

        (settings_json, self.index, self.http_port, self.grpc_port, self.http_path,
         self.grpc_path, self.requests_fd, self.responses_fd, self.arena_bytes,
         ) = read_frame(read_exactly)  # fmt: skip
        self.settings = Settings.model_validate_json(settings_json)


async def _serve(start: _Start, sock: socket.socket) -> int:
    settings = start.settings
    loop = asyncio.get_running_loop()
    requests = Arena(start.requests_fd, start.arena_bytes)
    responses = Arena(start.responses_fd, start.arena_bytes)
    memory = RequestMemory.share(
        settings.max_request_memory, cpu_total_bytes(), int(settings.workers)
    )  # the pool writes its count of workers in their settings
    plane = WorkerPlane(settings, requests, responses, partial(_counts, memory), memory)
    intake = worker_intake(requests)  # closed by the model-owning process as its stop begins
    sock.setblocking(False)
    await loop.connect_accepted_socket(lambda: plane.protocol, sock)
    forwarder = HttpForwarder(start.http_path)
    http, http_task = None, None
    if start.http_port is not None:  # None: --allow-http false
        app = in_front_of(WorkerInferEndpoint(plane, settings, forwarder), forwarder)
        app = restricted(app, settings.http_restrictions())  # inference is answered here
        http = http_listener(app, settings, start.http_port, Protocol.HTTP, settings.tls,
                             intake=intake)  # fmt: skip
        listening = reuse_port_socket("HTTP", settings.http_host(), start.http_port, listening=True)
        http_task = asyncio.create_task(http.serve(sockets=[listening]))
    grpc = None
    if start.grpc_port is not None:  # None: --allow-grpc false
        grpc = WorkerGrpcServer(plane, settings, start.grpc_port, start.grpc_path, intake)
        await grpc.start()
    while http is not None and http_task is not None and not http.started:
        if http_task.done():
            await http_task
            return 1
        await asyncio.sleep(0.01)
    plane.protocol.send(("h",))
    counting = asyncio.create_task(_send_counts(plane, settings.metrics_interval_ms / 1000))
    draining = asyncio.create_task(plane.draining.wait())
    await asyncio.wait((draining, plane.lost), return_when=asyncio.FIRST_COMPLETED)
    if not draining.done():
        logger.error(
            "the model-owning process is gone: worker exiting", extra={"worker": start.index}
        )
        return 1
    timeout = settings.shutdown_timeout_seconds
    stopping: list[Awaitable[None]] = []
    if http is not None and http_task is not None:
        await http.wait_for_clients(loop.time() + timeout)
        http.stop()  # what it accepted has the timeout again
        stopping.append(http_task)
    if grpc is not None:
        stopping.append(grpc.stop(timeout))
    await asyncio.gather(*stopping)
    counting.cancel()
    plane.protocol.send(_counts(memory))
    forwarder.close()
    plane.protocol.close()
    return 0


async def _send_counts(plane: WorkerPlane, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        plane.protocol.send(_counts(plane.request_memory))


def _counts(memory: RequestMemory, asked: int = -1) -> Frame:
    return counts_frame(REFUSALS, read_core_call_counts(), asked, memory.held)


def main(argv: list[str]) -> int:
    """A worker started afresh: its arenas' descriptors kept the numbers the first frame
    gives."""
    die_with_parent(os.getppid())  # Linux; elsewhere the closed socket still stops it
    return serve_link(int(argv[1]))


def serve_forked(fds: Sequence[int]) -> int:
    """A worker forked by the fork server: its descriptors arrived renumbered, in the order
    link, requests' arena, responses' arena."""
    link, requests_fd, responses_fd = fds
    return serve_link(link, (requests_fd, responses_fd))


def tune_process(settings: Settings) -> None:
    """What a worker sets up before its threads start: its scheduling policy, its garbage
    collector, and one allocator arena. A forked worker comes from the fork server, which
    starts before the model-owning process limits its arenas, so it had glibc's default (8
    per core), and grpc's threads each took one: under L0_memory_growth's load (20 clients
    sending 4.8 MB requests, two workers) each worker grew to 450-600 MB against 200-345 MB
    with one arena (``runtime/malloc_tuning.py``)."""
    cpu_scheduling.apply(settings.cpu_scheduling)  # inherited; again in case it was not
    gc_tuning.tune()
    malloc_tuning.limit_arenas()


def serve_link(link: int, arena_fds: tuple[int, int] | None = None) -> int:
    for sig in STOP_SIGNALS:  # the model-owning process's to act on: it drains the workers
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=link)
    start = _Start(sock)
    name_process(WORKER_NAME.format(index=start.index), WORKER_TITLE.format(index=start.index))
    if arena_fds is not None:
        start.requests_fd, start.responses_fd = arena_fds
    settings = start.settings
    configure_logging(
        settings.log_level, settings.log_format, settings.log_switches(), settings.log_file
    )
    tune_process(settings)
    handshake = settings.http_header_timeout_seconds
    code: int = uvloop.run(
        _serve(start, sock), loop_factory=lambda: BoundedHandshakeLoop(handshake)
    )
    os.close(start.requests_fd)
    os.close(start.responses_fd)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
