"""Workers forked from a copy of this program made before it ran anything (``--workers N``).

A fresh interpreter spends about 1.3 s of CPU importing FastAPI, grpc, numpy and batchserve
before it can serve, and a worker paid it at every start and every replacement. The fork
server is forked from the model-owning process once, after its imports and before it starts
an event loop, a socket, a model or a thread of its own; from then on it does one thing:
fork a worker when asked, which starts with every module already imported. The
model-owning process cannot fork workers itself once it serves: it then runs ONNX
Runtime's and grpc's threads, which a fork would copy in whatever state they were.

Each worker is forked twice over (the fork server forks a short-lived middle process, which
forks the worker and exits), and the model-owning process is the child subreaper
(``PR_SET_CHILD_SUBREAPER``), so every worker is adopted by it: the workers are the
model-owning process's children, as fresh interpreters would be, it alone reaps and kills
them (through a pidfd each, which the middle process sends it), and the fork server is a
helper whose death disturbs no worker and no request. A fork server that dies is replaced
by one started afresh (``python -m batchserve.runtime.fork_server``), after a pause that
doubles while they keep dying young; workers asked for meanwhile start as fresh
interpreters.

The fork server and every worker die with the model-owning process
(``PR_SET_PDEATHSIG``). Linux only (``pidfd_open``); elsewhere every worker is a fresh
interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import importlib
import logging
import os
import signal
import socket
import struct
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import setproctitle

from batchserve.observability.logs import release_log_file
from batchserve.runtime.orphans import Orphans
from batchserve.runtime.stop_signals import SIGNALS as STOP_SIGNALS

logger = logging.getLogger(__name__)

Target = Callable[[Sequence[int]], int]
"""What a forked worker runs, given its descriptors (its end of the link to the
model-owning process, then its two arenas); its return value is its exit status. A
module-level function: a fork server started afresh imports it by name."""

_FORK = b"f"
_STARTED = b"s"
_FAILED = b"e"
_RECORD = struct.Struct("=ci")  # kind, pid
_FDS_PER_WORKER = 3  # its link, then its requests' and responses' arenas
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
FORK_SERVER_NAME = "bs-fork-server"
FORK_SERVER_TITLE = "batchserve: fork server"
WORKER_NAME = "bs-worker-{index}"
WORKER_TITLE = "batchserve: worker {index}"
ADOPTION_WAIT_S = 5.0
"""How long a new worker waits for its middle process to exit (microseconds, normally)."""
REAP_RETRY_S = 0.005
REAP_TRIES = 1000
"""A worker that exits in the instant between its middle process's exit and its adoption
is reaped once adopted: retried this often, this many times."""
KILLED_REAP_RETRY_S = 1.0
FORK_WAIT_S = 10.0
"""How long a fork may take (milliseconds, normally) before the fork server is taken for
hung: killed and replaced, the worker started afresh."""
RESPAWN_PAUSE_S = 1.0
RESPAWN_PAUSE_MAX_S = 60.0
"""The pause before a dead fork server is replaced doubles up to this, and starts again from
``RESPAWN_PAUSE_S`` after one that lived at least this long."""


class CannotFork(RuntimeError):
    """The fork server has exited, or its fork failed: start the worker afresh."""


class ForkedWorker:
    """A worker the fork server forked and this process adopted; what the pool uses of
    ``asyncio.subprocess.Process``."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._ended)

    async def wait(self) -> int:
        """Its exit status (negative: the signal that ended it)."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """SIGKILL through its pidfd: never another process that took its pid."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _ended(self) -> None:
        self._loop.remove_reader(self._pidfd)
        _reap_adopted(self._loop, self.pid, self._finish)

    def _finish(self, status: int) -> None:
        os.close(self._pidfd)
        self._pidfd = -1
        if not self._exited.done():
            self._exited.set_result(status)


def _reap_adopted(
    loop: asyncio.AbstractEventLoop,
    pid: int,
    finish: Callable[[int], None],
    tries: int = 0,
    killed: bool = False,
) -> None:
    """Reap an exited worker and tell ``finish`` its status; until its middle process has
    exited it is not yet this process's, and is tried again. One this process ``killed`` is
    tried until it is reaped, once a second after the first ``REAP_TRIES``: it is adopted here
    whenever its middle process exits, and then only this process may reap it."""
    try:
        reaped, wait_status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        reaped = wait_status = 0
    if reaped == 0:
        if tries + 1 < REAP_TRIES or killed:
            pause = REAP_RETRY_S if tries + 1 < REAP_TRIES else KILLED_REAP_RETRY_S
            again = functools.partial(_reap_adopted, loop, pid, finish, tries + 1, killed)
            loop.call_later(pause, again)
            return
        logger.warning("an exited worker was never adopted", extra={"pid": pid})
        finish(-signal.SIGKILL)
        return
    finish(os.waitstatus_to_exitcode(wait_status))


class ForkServer:
    """The model-owning process's end: asks for forks, and starts a fresh fork server when
    its fork server dies."""

    def __init__(self, pid: int, control: socket.socket, target: Target) -> None:
        self.pid = pid
        self._control = control
        self._target = f"{target.__module__}:{target.__qualname__}"
        self._started: asyncio.Queue[tuple[int, int]] = asyncio.Queue()  # (pid, pidfd)
        self._forking = asyncio.Lock()
        self._pause = RESPAWN_PAUSE_S
        self._since = time.monotonic()
        self._respawn: asyncio.TimerHandle | None = None
        self._closed = False
        self.alive = True
        self.orphans = Orphans((FORK_SERVER_NAME, WORKER_NAME.partition("{")[0]), self._hear)
        """The processes forked here that nothing waits for, such as a middle process whose
        fork server died; the pool claims the workers it waits for."""
        self.orphans.claim(pid)

    @classmethod
    def start(cls, target: Target) -> ForkServer | None:
        """Fork the fork server; call it before any event loop, socket or thread of this
        program exists. None where workers cannot be forked and adopted here (not Linux)."""
        if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
            return None
        if not _become_subreaper():
            logger.warning("workers start as fresh interpreters: this process cannot adopt them")
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
        logger.info("fork server started", extra={"pid": pid, "forked": True})
        return cls(pid, ours, target)

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
            try:
                pid, pidfd = await asyncio.wait_for(self._started.get(), FORK_WAIT_S)
            except TimeoutError:  # stopped or hung: replaced, as one that exited is
                self._gone()
                raise CannotFork("the fork server did not answer") from None
            if pid <= 0:
                raise CannotFork("the fork server has exited" if pid == 0 else "fork failed")
            return ForkedWorker(pid, pidfd)

    def _on_readable(self) -> None:
        while True:
            try:
                record, fds, _, _ = socket.recv_fds(self._control, _RECORD.size, 1)
            except BlockingIOError:
                return
            except OSError:
                record, fds = b"", []
            if len(record) != _RECORD.size:
                for fd in fds:
                    os.close(fd)
                self._gone()
                return
            kind, pid = _RECORD.unpack(record)
            if kind == _STARTED and len(fds) == 1:
                self.orphans.claim(pid)
                self._started.put_nowait((pid, fds[0]))
                continue
            for fd in fds:
                os.close(fd)
            if kind == _STARTED:  # its pidfd was lost on the way: this process is out of fds
                self._discard(pid)
            else:  # its middle process failed, and may have killed a worker adopted here
                self.orphans.sweep_soon()
            self._started.put_nowait((-1, -1))

    def _hear(self) -> None:
        """Read what the fork server sent: a sweep must not take a worker whose pid is on
        its way."""
        if self.alive:
            self._on_readable()

    def _discard(self, pid: int) -> None:
        """Kill and reap a worker whose pidfd never arrived: the pool starts another, and
        this one must neither serve unwatched nor stay a zombie here. Its pid cannot name
        another process: only this process, the one that adopts it, may reap it."""
        self.orphans.claim(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        _reap_adopted(loop, pid, lambda status: self.orphans.release(pid), killed=True)

    def _gone(self) -> None:
        """The fork server exited: its workers serve on (this process adopted them); a fresh
        fork server replaces it, forks meanwhile start fresh interpreters."""
        if not self.alive:
            return
        self.alive = False
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(self._control.fileno())
        self._control.close()
        self._reap()
        self.orphans.sweep_soon()  # its middle processes, adopted here
        self._started.put_nowait((0, -1))  # a fork waiting for its pid
        if time.monotonic() - self._since >= RESPAWN_PAUSE_MAX_S:
            self._pause = RESPAWN_PAUSE_S  # not a fork server that keeps dying
        logger.error(
            "the fork server exited; its workers serve on and a fresh one replaces it",
            extra={"pid": self.pid, "seconds": self._pause},
        )
        self._respawn = loop.call_later(self._pause, self._spawn)
        self._pause = min(2 * self._pause, RESPAWN_PAUSE_MAX_S)

    def _spawn(self) -> None:
        """A fork server started afresh: it imports what the first one had, then forks."""
        self._respawn = None
        if self._closed:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        argv = [sys.executable, "-m", __name__, str(theirs.fileno()), self._target]
        try:
            self.pid = os.posix_spawn(sys.executable, argv, os.environ)
        except OSError as exc:
            logger.error("the fork server could not be started again", extra={"error": str(exc)})
            ours.close()
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self.orphans.claim(self.pid)
        self._control = ours
        self._started = asyncio.Queue()
        self._since = time.monotonic()
        self.alive = True
        self.attach()
        logger.info("fork server started", extra={"pid": self.pid, "forked": False})

    def close(self) -> None:
        """Stop the fork server (the workers stop on their own) and reap it."""
        self._closed = True
        self.orphans.close()
        if self._respawn is not None:
            self._respawn.cancel()
        if self.alive:
            self.alive = False
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._control.fileno())
            self._control.close()
            self._reap()

    def _reap(self) -> None:
        """Kill and reap it: one stopped or hung (SIGSTOP, a debugger) would otherwise hold
        this process's exit, or a fork, for as long as it stays so. Its pid is its own until
        reaped here."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.orphans.release(self.pid)


def name_process(name: str, title: str) -> None:
    """What ``ps``, ``top`` and ``pgrep`` show for this process: ``title`` as its command
    line, ``name`` (15 bytes at most) in /proc/PID/comm (Linux). A forked process would
    otherwise show the model-owning process's command line, and be found as the server."""
    setproctitle.setproctitle(title)  # the comm too, cut: set after it
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15])


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies, however it dies (Linux; elsewhere a
    worker still stops when its link closes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux 3.4 and later)."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)) == 0
    except (OSError, AttributeError):
        return False


def _serve(control: socket.socket, owner: int, target: Target) -> int:  # pragma: no cover
    """The fork server's life: fork on request, leave when the model-owning process closes
    its end (it has exited, or stopped its workers)."""
    die_with_parent(owner)
    name_process(FORK_SERVER_NAME, FORK_SERVER_TITLE)
    for sig in STOP_SIGNALS:  # the model-owning process's to act on
        signal.signal(sig, signal.SIG_IGN)
    release_log_file()  # before its descriptor closes below, not after another takes it
    os.closerange(3, control.fileno())  # what the owner had open; a worker gets only its own
    os.closerange(control.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    gc.collect()
    gc.freeze()  # the imported heap stays out of the workers' collections, and shared
    control.setblocking(True)
    forker = _Forker(control, owner, target)
    while True:
        message, fds, _, _ = socket.recv_fds(control, _RECORD.size, _FDS_PER_WORKER)
        if not message:
            return 0
        if message[:1] == _FORK and len(fds) == _FDS_PER_WORKER:
            forker.fork(fds)
        elif message[:1] == _FORK:  # descriptors lost (this process had too many open)
            control.send(_RECORD.pack(_FAILED, -1))
        for fd in fds:
            os.close(fd)


@dataclass(frozen=True)
class _Forker:  # pragma: no cover - runs in the fork server and the processes it forks
    """Each worker forked by a middle process, which sends its pid and pidfd to the
    model-owning process and exits, so that the worker is adopted there."""

    control: socket.socket
    owner: int
    target: Target

    def fork(self, fds: list[int]) -> None:
        """Fork the middle process and reap it; where it sent nothing, say so."""
        try:
            middle = os.fork()
        except OSError:
            self.control.send(_RECORD.pack(_FAILED, -1))
            return
        if middle == 0:
            self._middle(fds)
        _, wait_status = os.waitpid(middle, 0)
        if os.waitstatus_to_exitcode(wait_status) != 0:
            self.control.send(_RECORD.pack(_FAILED, -1))

    def _middle(self, fds: list[int]) -> NoReturn:
        status = 1
        try:
            middle = os.getpid()
            worker = os.fork()
            if worker == 0:
                self._run_worker(fds, middle)
            try:
                pidfd = os.pidfd_open(worker)  # while it is still this process's: its pid
                socket.send_fds(self.control, [_RECORD.pack(_STARTED, worker)], [pidfd])
                status = 0
            except OSError:  # the pool starts this worker afresh: this one must not serve
                os.kill(worker, signal.SIGKILL)
        finally:
            os._exit(status)

    def _run_worker(self, fds: list[int], middle: int) -> NoReturn:
        status = 1
        try:
            self.control.close()
            # the middle process's pid as it knew it: by the time this runs it may have
            # exited already, and getppid() then names the model-owning process
            deadline = time.monotonic() + ADOPTION_WAIT_S
            while os.getppid() == middle and time.monotonic() < deadline:
                time.sleep(0.0002)  # the middle process exits once it has sent the pidfd
            die_with_parent(self.owner)  # adopted by the model-owning process, or gone
            status = self.target(fds)
        except BaseException:  # what a fresh interpreter's traceback would have said
            logger.exception("worker failed")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


def main(argv: list[str]) -> int:  # pragma: no cover - runs in a fork server started afresh
    """A fork server started afresh: its link, then its target as ``module:function``."""
    control = socket.socket(fileno=int(argv[1]))
    owner = os.getppid()
    die_with_parent(owner)
    module, _, function = argv[2].partition(":")
    target: Target = getattr(importlib.import_module(module), function)
    return _serve(control, owner, target)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
