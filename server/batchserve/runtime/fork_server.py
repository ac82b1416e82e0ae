"""Workers forked from a copy of this program made before it ran anything (``--workers N``).

A fresh interpreter spends about 1.3 s of CPU importing FastAPI, grpc, numpy and batchserve
before it can serve, and a worker paid it at every start and every replacement. The fork
server is forked from the model-owning process once, after its imports and before it starts
an event loop, a socket, a model or a thread of its own; from then on it does one thing:
fork a worker when asked, which starts with every module already imported, and report each
worker's exit. The model-owning process cannot fork workers itself once it serves: it then
runs ONNX Runtime's and grpc's threads, which a fork would copy in whatever state they were.

The fork server dies with the model-owning process, and each worker with the fork server
(``PR_SET_PDEATHSIG``). If the fork server dies alone, its workers go with it and the pool
starts the replacements as fresh interpreters. Linux only (``pidfd_open``); elsewhere every
worker is a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

logger = logging.getLogger(__name__)

Target = Callable[[Sequence[int]], int]
"""What a forked worker runs, given its descriptors (its end of the link to the
model-owning process, then its two arenas); its return value is its exit status."""

_FORK = b"f"
_KILL = b"k"
_STARTED = b"s"
_EXITED = b"x"
_RECORD = struct.Struct("=cii")  # kind, pid, exit status
_FDS_PER_WORKER = 3  # its link, then its requests' and responses' arenas
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
FORK_SERVER_NAME = "bs-fork-server"
WORKER_NAME = "bs-worker-{index}"


class CannotFork(RuntimeError):
    """The fork server has exited, or its fork failed: start the worker afresh."""


class ForkedWorker:
    """A worker the fork server forked; what the pool uses of ``asyncio.subprocess.Process``."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        """Its exit status (negative: the signal that ended it), once the fork server reaps it."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """SIGKILL, sent by the fork server: it alone knows the pid is not yet reaped, so
        never reused by another process."""
        self._server.kill(self.pid)

    def exited(self, status: int) -> None:
        if not self._exited.done():
            self._exited.set_result(status)


class ForkServer:
    """The model-owning process's end: asks for forks, hears of exits."""

    def __init__(self, pid: int, control: socket.socket) -> None:
        self.pid = pid
        self._control = control
        self._workers: dict[int, ForkedWorker] = {}
        self._started: asyncio.Queue[int] = asyncio.Queue()  # pids, in the order asked
        self._forking = asyncio.Lock()
        self.alive = True

    @classmethod
    def start(cls, target: Target) -> ForkServer | None:
        """Fork the fork server; call it before any event loop, socket or thread of this
        program exists. None where workers cannot be forked here (not Linux)."""
        if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        owner = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python 3.12 warns of a fork in a process with threads: here only the BLAS
            # library's idle pool, which its fork handlers stop; neither the fork server
            # nor a worker calls into it.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the fork server, which leaves by _exit
            ours.close()
            status = 1
            try:
                status = _serve(theirs, owner, target)
            finally:
                os._exit(status)
        theirs.close()
        ours.setblocking(False)
        logger.info("fork server started", extra={"pid": pid})
        return cls(pid, ours)

    def attach(self) -> None:
        """Hear the fork server from the running loop."""
        asyncio.get_running_loop().add_reader(self._control.fileno(), self._on_readable)

    async def fork(self, fds: Sequence[int]) -> ForkedWorker:
        """A worker forked with these descriptors (its link, then its two arenas)."""
        async with self._forking:
            if not self.alive:
                raise CannotFork("the fork server has exited")
            try:
                socket.send_fds(self._control, [_FORK], list(fds))
            except BlockingIOError:  # its socket is full: it is alive but not reading
                raise CannotFork("the fork server is not reading") from None
            except OSError as exc:
                self._gone()
                raise CannotFork(f"the fork server has exited: {exc}") from None
            pid = await self._started.get()
            if pid <= 0:
                raise CannotFork("the fork server has exited" if pid == 0 else "fork failed")
            worker = ForkedWorker(self, pid)
            self._workers[pid] = worker
            return worker

    def kill(self, pid: int) -> None:
        """Ask for SIGKILL to a worker it forked (nothing once it is gone: so are they)."""
        if self.alive:
            with contextlib.suppress(OSError):
                self._control.send(_RECORD.pack(_KILL, pid, 0))

    def _on_readable(self) -> None:
        while True:
            try:
                record = self._control.recv(_RECORD.size)
            except BlockingIOError:
                return
            except OSError:
                record = b""
            if len(record) != _RECORD.size:
                self._gone()
                return
            kind, pid, status = _RECORD.unpack(record)
            if kind == _STARTED:
                self._started.put_nowait(pid)
            elif kind == _EXITED and (worker := self._workers.pop(pid, None)) is not None:
                worker.exited(status)

    def _gone(self) -> None:
        """The fork server exited: its workers die with it (their death signal); each is
        reported killed, and later workers start as fresh interpreters."""
        if not self.alive:
            return
        self.alive = False
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._control.fileno())
        logger.error(
            "the fork server exited; its workers exit with it and are replaced by fresh "
            "interpreters",
            extra={"pid": self.pid},
        )
        for worker in self._workers.values():
            worker.exited(-signal.SIGKILL)
        self._workers.clear()
        self._started.put_nowait(0)  # a fork waiting for its pid
        self._reap()

    def close(self) -> None:
        """Stop the fork server (after the workers have stopped) and reap it."""
        if self.alive:
            self.alive = False
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._control.fileno())
        self._control.close()
        self._reap()

    def _reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def name_process(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and /proc/PID/comm show (Linux; 15 bytes at most): a
    forked worker's command line is the model-owning process's."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15])


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies, however it dies (Linux; elsewhere a
    worker still stops when its link closes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _serve(control: socket.socket, owner: int, target: Target) -> int:  # pragma: no cover
    """The fork server's life: fork on request, reap and report exits, leave when the
    model-owning process closes its end (it has exited, or stopped its workers)."""
    die_with_parent(owner)
    name_process(FORK_SERVER_NAME)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the model-owning process's to act on
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, control.fileno())  # what the owner had open; a worker gets only its own
    os.closerange(control.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    gc.collect()
    gc.freeze()  # the imported heap stays out of the workers' collections, and shared
    with selectors.DefaultSelector() as selector:
        forks = _Forks(control, selector, target)
        selector.register(control, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is not control:
                    forks.reap(int(key.fd))
                elif not forks.answer():
                    return 0


class _Forks:  # pragma: no cover - runs in the fork server
    """The fork server's workers: each one's pidfd, watched until it exits."""

    def __init__(
        self, control: socket.socket, selector: selectors.BaseSelector, target: Target
    ) -> None:
        self.control = control
        self.selector = selector
        self.target = target
        self.children: dict[int, int] = {}  # pidfd -> pid

    def answer(self) -> bool:
        """Act on one request; False when the model-owning process has closed its end."""
        message, fds, _, _ = socket.recv_fds(self.control, _RECORD.size, _FDS_PER_WORKER)
        if not message:
            return False
        if message[:1] == _FORK:
            self.control.send(_RECORD.pack(_STARTED, self._fork(fds), 0))
        elif message[:1] == _KILL and len(message) == _RECORD.size:
            pid = _RECORD.unpack(message)[1]
            if pid in self.children.values():  # not yet reaped: still this worker's pid
                os.kill(pid, signal.SIGKILL)
        return True

    def _fork(self, fds: list[int]) -> int:
        """The new worker's pid; -1 when the fork failed (the pool then starts it afresh)."""
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:
            self._run_worker(fds)
        for fd in fds:
            os.close(fd)
        if pid > 0:
            try:
                pidfd = os.pidfd_open(pid)  # before it can be reaped: the pid is still its own
            except OSError:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -1
            self.children[pidfd] = pid
            self.selector.register(pidfd, selectors.EVENT_READ)
        return pid

    def _run_worker(self, fds: list[int]) -> NoReturn:
        status = 1
        try:
            self.selector.close()
            self.control.close()
            for pidfd in self.children:
                os.close(pidfd)
            die_with_parent(os.getppid())
            status = self.target(fds)
        except BaseException:  # what a fresh interpreter's traceback would have said
            logger.exception("worker failed")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def reap(self, pidfd: int) -> None:
        """A worker exited: reap it and tell the model-owning process its status."""
        self.selector.unregister(pidfd)
        pid = self.children.pop(pidfd)
        os.close(pidfd)
        _, wait_status = os.waitpid(pid, 0)
        self.control.send(_RECORD.pack(_EXITED, pid, os.waitstatus_to_exitcode(wait_status)))
