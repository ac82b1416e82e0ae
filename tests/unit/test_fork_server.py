"""The fork server's protocol, driven in a fresh interpreter (the fork server must be forked
before any thread exists, which a pytest process cannot promise): a forked target gets its
descriptors renumbered and in order, is adopted by the process that asked for it (its
parent, which reaps it: an exception is status 1, a signal negative), and is killed through
its pidfd; a fork server that dies leaves its workers running, refuses forks until a fresh
one, started by name, forks in its place; a process whose parent died first (a middle
process whose fork server died mid-fork, a worker its middle process killed) is reaped by the
process that adopted it, not left a zombie."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks with pidfd_open (Linux)")

TARGET = textwrap.dedent(
    """
    import os, socket, time

    HOLD = os.environ["FORK_HOLD"]
    _pidfd_open = os.pidfd_open

    def _held_pidfd_open(pid, flags=0):
        # a middle process waits here while HOLD exists: the fork server can die mid-fork
        while os.path.exists(HOLD):
            time.sleep(0.01)
        return _pidfd_open(pid, flags)

    os.pidfd_open = _held_pidfd_open

    def target(fds):
        link, first, second = fds
        peer = socket.socket(fileno=link)
        heard = os.read(first, 16) + b"|" + os.read(second, 16)
        peer.sendall(heard + b"|" + str(os.getppid()).encode())
        order = peer.recv(16)
        if order == b"raise":
            raise RuntimeError("the worker failed")
        if order == b"hang":
            time.sleep(60)
        if order == b"stay":
            order = peer.recv(16)  # the next order, after the fork server has died
        return int(order)
    """
)

SCRIPT = textwrap.dedent(
    """
    import asyncio, contextlib, json, os, resource, signal, socket, sys, time
    from batchserve.runtime import fork_server
    from batchserve.runtime.fork_server import CannotFork, ForkServer
    import fork_target
    from fork_target import target

    fork_server.RESPAWN_PAUSE_S = 0.2
    forks = ForkServer.start(target)
    results = {}
    starts = []

    async def one(order, then=b""):
        asked = time.monotonic()
        ours, theirs = socket.socketpair()
        first_r, first_w = os.pipe()
        second_r, second_w = os.pipe()
        os.write(first_w, b"first")
        os.write(second_w, b"second")
        worker = await forks.fork((theirs.fileno(), first_r, second_r))
        for fd in (theirs.fileno(), first_r, second_r, first_w, second_w):
            os.close(fd)
        theirs.detach()
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        heard, _, parent = (await loop.sock_recv(ours, 64)).decode().rpartition("|")
        starts.append(time.monotonic() - asked)
        await loop.sock_sendall(ours, order)
        if order == b"hang":
            await asyncio.sleep(0.2)
            worker.kill()
        if then:
            await asyncio.sleep(0.2)
            os.kill(forks.pid, signal.SIGKILL)
            while forks.alive:
                await asyncio.sleep(0.01)
            try:
                await forks.fork((0, 1, 2))
            except CannotFork as exc:
                results["refused"] = str(exc)
            await loop.sock_sendall(ours, then)
        status = await worker.wait()
        ours.close()
        return heard, status, int(parent) == os.getpid()

    async def main():
        forks.attach()
        first = forks.pid
        results["runs"] = await asyncio.gather(one(b"0"), one(b"3"), one(b"raise"), one(b"hang"))
        results["more"] = [run[1] for run in await asyncio.gather(*(one(b"0") for _ in range(16)))]
        results["slowest_start"] = max(starts)
        results["survivor"] = await one(b"stay", then=b"7")
        results["first_reaped"] = not os.path.exists(f"/proc/{first}")
        while not forks.alive:
            await asyncio.sleep(0.05)
        results["replaced"] = forks.pid != first
        results["after"] = await one(b"5")
        results["mid_fork"] = await mid_fork()
        while not forks.alive:
            await asyncio.sleep(0.05)
        results["middle_failed"] = await middle_failed()
        results["lost"], results["left"] = await lost_pidfd()
        results["hung"] = await hung()

    async def hung():
        # a stopped fork server does not answer: the fork is refused once FORK_WAIT_S has
        # passed, and the stopped one is killed, reaped and replaced
        fork_server.FORK_WAIT_S = 0.3
        stopped = forks.pid
        os.kill(stopped, signal.SIGSTOP)
        refused = await refusal()
        reaped = not os.path.exists(f"/proc/{stopped}")
        while not forks.alive:
            await asyncio.sleep(0.05)
        return refused, reaped, forks.pid != stopped, (await one(b"4"))[1]

    def children():
        tasks = os.listdir("/proc/self/task")
        found = [open(f"/proc/self/task/{t}/children").read().split() for t in tasks]
        pids = sorted(int(pid) for pids in found for pid in pids if int(pid) != forks.pid)
        return [described(pid) for pid in pids]

    def described(pid):
        # pid (name) state, as /proc/PID/stat begins
        try:
            return " ".join(open(f"/proc/{pid}/stat").read().split()[:3])
        except OSError:
            return str(pid)

    async def no_children_left():
        # until the fork server has reaped its middle process, the worker that process forked
        # is not yet this process's child: none here may only mean none adopted yet
        deadline = time.monotonic() + 10
        while (children() or kids(forks.pid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return children()

    def kids(pid):
        try:
            return open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            return []

    def held_middle(server):
        # a child of the fork server that has forked its worker: the middle process being held
        # (one that has exited, its worker adopted here, may not have been reaped there yet)
        return any(kids(int(middle)) for middle in kids(server))

    async def mid_fork():
        # the fork server dies while its middle process forks: the middle process, adopted
        # here, is reaped once it exits, and the worker it forked serves
        server = forks.pid
        open(fork_target.HOLD, "w").close()
        worker = asyncio.ensure_future(one(b"6"))
        while not held_middle(server):
            await asyncio.sleep(0.01)
        os.kill(server, signal.SIGKILL)
        await asyncio.sleep(0.1)
        os.remove(fork_target.HOLD)
        return (await worker)[1], await no_children_left()

    async def middle_failed():
        # the middle process cannot take its worker's pidfd (the fork server is out of
        # descriptors): it kills the worker and exits, and the killed worker, adopted here, is
        # reaped; the fork is refused
        await one(b"0")  # one started afresh has imported and serves; then it is at rest
        server = forks.pid
        while len(os.listdir(f"/proc/{server}/fd")) != 4:  # 0, 1, 2 and its socket
            await asyncio.sleep(0.01)  # (not still closing the last fork's descriptors)
        used = {int(fd) for fd in os.listdir(f"/proc/{server}/fd")}
        free = [fd for fd in range(len(used) + 4) if fd not in used]
        refused = await refusal(lambda: limited(server, free[3]))  # room for three
        return refused, await no_children_left()

    async def lost_pidfd():
        # no descriptor to spare when the worker's pidfd arrives: the fork is refused, and
        # the worker it made is killed and reaped, not left serving or a zombie
        def no_descriptor_to_spare():
            free = os.dup(0)  # the lowest free number: every one below it is in use
            os.close(free)
            return limited(os.getpid(), free)

        refused = await refusal(no_descriptor_to_spare)
        return refused, await no_children_left()

    async def refusal(limits=contextlib.nullcontext):
        # a fork of throwaway descriptors, asked for within limits(): why it was refused
        ours, theirs = socket.socketpair()
        pipes = [*os.pipe(), *os.pipe()]
        try:
            with limits():
                await forks.fork((theirs.fileno(), pipes[0], pipes[2]))
            return None
        except CannotFork as exc:
            return str(exc)
        finally:
            for fd in pipes:
                os.close(fd)
            theirs.close()
            ours.close()

    @contextlib.contextmanager
    def limited(pid, descriptors):
        # the process's descriptors below this number, for the block's length
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (descriptors, hard))
        try:
            yield
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))

    asyncio.run(main())
    second = forks.pid
    forks.close()
    results["second_reaped"] = not os.path.exists(f"/proc/{second}")
    print(json.dumps(results))
    """
)


def test_forks_adoption_statuses_kills_and_a_replaced_fork_server(tmp_path: Path) -> None:
    (tmp_path / "fork_target.py").write_text(TARGET)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": path, "FORK_HOLD": str(tmp_path / "hold")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [run[0] for run in results["runs"]] == ["first|second"] * 4
    assert [run[1] for run in results["runs"]] == [0, 3, 1, -9]
    assert all(run[2] for run in results["runs"])  # each worker's parent: the asking process
    assert results["more"] == [0] * 16
    # a worker waits for its adoption only while its middle process lives (microseconds),
    # however soon after that exit it runs; ADOPTION_WAIT_S (5 s) is the bound, not the wait
    assert results["slowest_start"] < 2.0
    assert results["survivor"] == ["first|second", 7, True]  # it outlived its fork server
    assert results["refused"] == "the fork server has exited"
    assert results["first_reaped"] is True
    assert results["replaced"] is True
    assert results["after"] == ["first|second", 5, True]  # forked by the one started by name
    assert results["second_reaped"] is True
    assert results["mid_fork"] == [6, []]  # the worker served; its middle process was reaped
    assert results["middle_failed"] == ["fork failed", []]
    assert results["lost"] == "fork failed"
    assert results["left"] == []
    assert results["hung"] == ["the fork server did not answer", True, True, 4]
    assert "the worker failed" in done.stderr  # the traceback of the target that raised
