"""The model-owning process's workers (``--workers N``): started, watched, replaced when one
dies, told to drain on shutdown.

Each worker is forked by the fork server (``fork_server``), which this process forked before
it ran anything, and adopted by this process; or, where there is no fork server, started as
a fresh interpreter (``python -m batchserve.runtime.worker_process``); never forked from this
process, which runs ONNX Runtime's and grpc's threads. Either way it is this process's
child, and gets one end of a socket pair and its two arenas' memfds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from asyncio.subprocess import Process
from dataclasses import dataclass

from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.engine_link import EngineLink
from batchserve.dataplane.handoff.frames import pack_frame
from batchserve.dataplane.handoff.intake_word import worker_intake
from batchserve.dataplane.plane import DataPlane
from batchserve.observability import log_settings
from batchserve.observability.trace_settings import Snapshot
from batchserve.runtime.fork_server import CannotFork, ForkedWorker, ForkServer
from batchserve.runtime.worker_counts import WorkerCounts

logger = logging.getLogger(__name__)

ARENA_BYTES = 64 << 20
"""Each arena's size: a request (or response) larger than what is free goes inline."""
UNMAP_RETRY_S = 1.0
"""Between tries to unmap a dead worker's arenas while a batch still reads its requests."""
UNMAP_TRIES = 300
RESTART_PAUSE_S = 1.0
"""Between a worker's death and its replacement: a worker that dies at start-up must not
spin."""
START_RETRY_MAX_S = 60.0
"""The longest pause between tries to start a replacement that could not be started."""
CHECK_INTERVAL_MAX_S = 5.0
"""The longest time between two checks that a worker's event loop runs (``--worker-timeout``
divided by four where shorter)."""
COUNTS_WAIT_S = 0.5
"""How long a scrape waits for the workers' counts; one that is late keeps its last report
(at most a second old)."""
WORKER_MODULE = "batchserve.runtime.worker_process"


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the workers listen, and where they reach this process."""

    http_port: int | None
    grpc_port: int | None
    """None: not served (``--allow-http`` / ``--allow-grpc`` false)."""
    http_path: str
    grpc_path: str


@dataclass(slots=True)
class _Worker:
    process: ForkedWorker | Process
    link: EngineLink
    stalled: bool = False
    """Killed for leaving the checks unanswered; its exit is on the way."""


class WorkerPool:
    def __init__(
        self, settings: Settings, plane: DataPlane, count: int, endpoints: Endpoints,
        counts: WorkerCounts, forks: ForkServer | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.forks = forks
        self.plane = plane
        self.count = count
        self.endpoints = endpoints
        self.counts = counts
        self.workers: dict[int, _Worker] = {}
        self.stopping = False
        self.intakes_closed = False
        """Set with ``close_intakes``: a worker started later starts closed."""
        self._gone: dict[int, tuple[int, int]] = {}  # (requests, handoffs) of replaced workers
        self._watchers: list[asyncio.Task[None]] = []
        self._unmapping: set[asyncio.Task[None]] = set()
        self._starting: set[asyncio.Future[_Worker]] = set()
        """Replacements being started: a stop waits for them, then drains them too."""
        self._claims: set[asyncio.Future[int]] = set()
        log_settings.follow(self._log_settings_changed)
        plane.control.trace.follow(self._trace_settings_changed)

    async def start(self) -> None:
        """Start every worker and wait until each listens (or failed to start)."""
        if self.forks is not None:
            self.forks.attach()
        started = await asyncio.gather(*(self._start(i) for i in range(self.count)))
        for index, worker in enumerate(started):
            self._watchers.append(asyncio.create_task(self._watch(index, worker)))
        timeout = self.settings.worker_timeout_seconds
        if timeout > 0:
            self._watchers.append(asyncio.create_task(self._check_answers(timeout)))
        await asyncio.gather(*(self._listening(w) for w in started))

    async def _listening(self, worker: _Worker) -> None:
        with contextlib.suppress(ConnectionError):
            await worker.link.listening

    async def _start(self, index: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        arenas: list[Arena] = []
        try:  # a start that fails is tried again: what it made must not pile up meanwhile
            for kind in ("requests", "responses"):
                arenas.append(Arena.create(f"batchserve-worker{index}-{kind}", ARENA_BYTES))
            requests, responses = arenas
            process = await self._process((theirs.fileno(), requests.fd, responses.fd))
            self._claim(process)
        except BaseException:
            ours.close()
            for arena in arenas:
                arena.close_descriptor()
                arena.close()
            raise
        finally:
            theirs.close()
        fds = (requests.fd, responses.fd)
        requests.close_descriptor()  # the mappings stay; the worker has its own copies
        responses.close_descriptor()
        ep = self.endpoints
        settings = self.settings.model_copy(update={"workers": str(self.count)})
        ours.sendall(pack_frame((settings.model_dump_json(), index, ep.http_port,
                                 ep.grpc_port, ep.http_path, ep.grpc_path, fds[0], fds[1],
                                 ARENA_BYTES)))  # fmt: skip
        link = EngineLink(index, self.plane, requests, responses, self.counts.update)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: link.protocol, ours)
        link.send(("l", log_settings.get()))  # as a client may have set them meanwhile
        link.send(("t", self.plane.control.trace.snapshot()))
        worker = _Worker(process, link)
        self.workers[index] = worker
        if self.intakes_closed:  # after the line above: a stop's signal now closes it either way
            worker_intake(requests).close()
        forked = isinstance(process, ForkedWorker)
        logger.info("worker started", extra={"worker": index, "pid": process.pid, "forked": forked})
        return worker

    async def _process(self, fds: tuple[int, int, int]) -> ForkedWorker | Process:
        """Forked where the fork server runs; otherwise a fresh interpreter, given the same
        descriptors under the same numbers."""
        if self.forks is not None and self.forks.alive:
            try:
                return await self.forks.fork(fds)
            except CannotFork as exc:
                logger.warning("worker started afresh", extra={"reason": str(exc)})
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", WORKER_MODULE, str(fds[0]), pass_fds=fds
        )

    def _claim(self, process: ForkedWorker | Process) -> None:
        """Leave the worker's exit status to its own waiter until it has been reaped: the
        fork server's sweeps reap the zombies no one claimed (``orphans``)."""
        if self.forks is None:
            return
        orphans = self.forks.orphans
        orphans.claim(process.pid)
        reaped = asyncio.ensure_future(process.wait())
        self._claims.add(reaped)

        def release(_: asyncio.Future[int]) -> None:
            self._claims.discard(reaped)
            orphans.release(process.pid)

        reaped.add_done_callback(release)

    async def _watch(self, index: int, worker: _Worker) -> None:
        """Replace the worker whenever it exits, until the pool stops."""
        while True:
            code = await worker.process.wait()
            await worker.link.closed
            self.counts.retire(index)
            requests, handoffs = self._gone.get(index, (0, 0))
            link = worker.link
            self._gone[index] = (requests + link.handed_over, handoffs + link.handoffs)
            # out of the pool until replaced: its counts are in ``_gone`` (left here, a scrape
            # meanwhile counted them twice, and the counter fell when it was replaced), and a
            # stop meanwhile has nothing of it to drain or to judge it by
            del self.workers[index]
            if self.stopping:  # its memory goes with this process
                return
            unmapping = asyncio.create_task(self._unmap(index, link))
            self._unmapping.add(unmapping)
            unmapping.add_done_callback(self._unmapping.discard)
            logger.error(
                "worker exited; its connections' requests were answered with an error by the "
                "closed connection and a new worker replaces it",
                extra={"worker": index, "pid": worker.process.pid, "exit_code": code},
            )
            replacement = await self._replace(index)
            if replacement is None:
                return
            worker = replacement

    async def _check_answers(self, timeout: float) -> None:
        """Kill a worker whose event loop has answered no check for ``timeout`` seconds
        (stopped, deadlocked, spinning): the kernel would go on handing it a share of the new
        connections, each left waiting for ever. Killed, it is replaced as a dead one is.
        A check that comes late means this process stalled and has not read their answers
        yet: it judges nobody."""
        interval = min(timeout / 4, CHECK_INTERVAL_MAX_S)
        loop = asyncio.get_running_loop()
        while not self.stopping:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            now = time.monotonic()
            judge = loop.time() - due < interval
            for index, worker in list(self.workers.items()):
                link = worker.link
                if judge and link.listening.done() and now - link.heard > timeout:
                    if not worker.stalled:
                        worker.stalled = True
                        logger.error(
                            "worker did not answer for the worker timeout; killed, to be "
                            "replaced",
                            extra={"worker": index, "pid": worker.process.pid, "seconds": timeout},
                        )  # fmt: skip
                        with contextlib.suppress(ProcessLookupError):
                            worker.process.kill()
                else:
                    link.send(("y",))

    async def _replace(self, index: int) -> _Worker | None:
        """The slot's next worker, after the pool's pause; None once the pool stops. A start
        that fails (descriptors or memory used up) is tried again after a pause that doubles
        up to a minute: its error used to end the slot's watcher, and the server served on a
        worker short for good, saying nothing."""
        pause = RESTART_PAUSE_S
        while True:
            await asyncio.sleep(pause)
            if self.stopping:
                return None
            starting = asyncio.ensure_future(self._start(index))
            self._starting.add(starting)
            starting.add_done_callback(self._starting.discard)
            try:
                return await asyncio.shield(starting)  # a stop meanwhile drains it too
            except Exception as exc:
                pause = min(2 * pause, START_RETRY_MAX_S)
                logger.error(
                    "a worker could not be started; trying again",
                    extra={"worker": index, "error": f"{type(exc).__name__}: {exc}",
                           "seconds": pause},
                )  # fmt: skip

    @staticmethod
    async def _unmap(index: int, link: EngineLink) -> None:
        """Return a dead worker's arenas: a worker that keeps dying must not leave 128 MiB
        of shared memory here each time (the objects holding them form cycles, and the
        startup heap is frozen: the collector may never free them). Their pages go at
        once; the mappings once no array of a batch still running views them."""
        link.requests.release_memory()
        link.responses.release_memory()
        for _ in range(UNMAP_TRIES):
            if all([link.requests.close(), link.responses.close()]):
                return
            await asyncio.sleep(UNMAP_RETRY_S)
        logger.warning(
            "a replaced worker's shared memory is still in use; left mapped",
            extra={"worker": index, "seconds": UNMAP_TRIES * UNMAP_RETRY_S},
        )

    async def fresh_counts(self) -> None:
        """Every worker's counts as of now, before a scrape of the metrics: a refusal that a
        client has seen is counted in the next scrape, as with one process."""
        links = [worker.link for worker in self.workers.values()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(link.fresh_counts() for link in links)), COUNTS_WAIT_S
            )

    def handed_over(self) -> dict[int, tuple[int, int]]:
        """(requests, hand-offs) of each worker slot, its replaced workers' included: a
        group of requests decoded in one pass is one hand-off."""
        totals = dict(self._gone)
        for index, worker in self.workers.items():
            requests, handoffs = totals.get(index, (0, 0))
            totals[index] = (requests + worker.link.handed_over, handoffs + worker.link.handoffs)
        return totals

    def _log_settings_changed(self, settings: log_settings.Answer) -> None:
        """The workers log by the settings a client set here, from its next request on
        (written at once, as ``_trace_settings_changed`` says why)."""
        for worker in self.workers.values():
            worker.link.send_now(("l", settings))

    def _trace_settings_changed(self, snapshot: Snapshot) -> None:
        """The workers sample their own requests by the settings a client set here.

        Written at once, not with this loop pass's other frames: the client's answer leaves
        on another socket as soon as the update returns, and its next request, through
        either worker, must find the settings there. A worker's loop handles its sockets
        in the order they became readable, so a frame written first is read first."""
        for worker in self.workers.values():
            worker.link.send_now(("t", snapshot))

    def repository_changed(self) -> None:
        """Models were loaded or unloaded: the workers ask again before trusting theirs.
        Written at once, ahead of the load's answer (``_trace_settings_changed``): a request
        sent after a reload must not be refused by a worker's copy of the old config."""
        for worker in self.workers.values():
            worker.link.send_now(("v",))

    def close_intakes(self) -> None:
        """Every worker refuses requests from now on, before its drain frame is read: safe
        in a signal handler (stores into shared memory, over a copy of the workers)."""
        self.intakes_closed = True
        for worker in list(self.workers.values()):
            worker_intake(worker.link.requests).close()

    async def stop(self, timeout: float) -> bool:
        """Drain every worker (they stop listening and answer what they accepted); True
        when all exited cleanly within ``timeout``, killing any that did not."""
        self.stopping = True
        if self._starting:  # a replacement forked now would otherwise miss the drain
            await asyncio.wait(self._starting, timeout=timeout)
        workers = list(self.workers.values())  # each leaves the dict as it exits
        for worker in workers:
            worker.link.send(("d",))
        clean = True
        for worker in workers:
            try:
                code = await asyncio.wait_for(worker.process.wait(), timeout)
            except TimeoutError:
                worker.process.kill()
                code = await worker.process.wait()
            clean = clean and code == 0
        for watcher in [*self._watchers, *self._unmapping]:
            watcher.cancel()
        if self.forks is not None:
            self.forks.close()
        return clean
