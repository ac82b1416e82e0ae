"""The fork server's protocol, driven in a fresh interpreter (the fork server must be forked
before any thread exists, which a pytest process cannot promise): a forked target gets its
descriptors renumbered and in order, its exit status comes back (an exception is 1, a
signal negative), a kill reaches only a live child, and once the fork server is gone every
child is reported killed and a fork is refused, so the pool starts the worker afresh."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks with pidfd_open (Linux)")

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, signal, socket, sys, time
    from batchserve.runtime.fork_server import CannotFork, ForkServer

    def target(fds):
        link, first, second = fds
        peer = socket.socket(fileno=link)
        peer.sendall(os.read(first, 16) + b"|" + os.read(second, 16))
        order = peer.recv(16)
        if order == b"raise":
            raise RuntimeError("the worker failed")
        if order in (b"hang", b"stay"):
            time.sleep(60)
        return int(order)

    forks = ForkServer.start(target)
    results = {}

    async def one(order):
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
        got = await loop.sock_recv(ours, 64)
        await loop.sock_sendall(ours, order)
        if order == b"hang":
            await asyncio.sleep(0.2)
            worker.kill()
        status = await worker.wait()
        ours.close()
        return got.decode(), status, os.getppid() != worker.pid

    async def main():
        forks.attach()
        results["runs"] = await asyncio.gather(one(b"0"), one(b"3"), one(b"raise"), one(b"hang"))
        hung = asyncio.ensure_future(one(b"stay"))
        await asyncio.sleep(0.5)
        os.kill(forks.pid, signal.SIGKILL)
        results["after_kill"] = (await hung)[1]
        results["alive"] = forks.alive
        try:
            await forks.fork((0, 1, 2))
        except CannotFork as exc:
            results["refused"] = str(exc)
        results["reaped"] = not os.path.exists(f"/proc/{forks.pid}")

    asyncio.run(main())
    forks.close()
    print(json.dumps(results))
    """
)


def test_forks_statuses_kills_and_a_lost_fork_server() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [run[0] for run in results["runs"]] == ["first|second"] * 4
    assert [run[1] for run in results["runs"]] == [0, 3, 1, -9]
    assert results["after_kill"] == -9  # reported killed: workers die with the fork server
    assert results["alive"] is False
    assert results["refused"] == "the fork server has exited"
    assert results["reaped"] is True
    assert "the worker failed" in done.stderr  # the traceback of the target that raised
