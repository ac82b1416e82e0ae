"""``--workers 2`` forks its workers from the fork server: a copy of the model-owning process
made after its imports, before it ran anything. The workers share its imported pages and are
adopted by the model-owning process; a killed worker is forked again; a killed fork server
disturbs no request and a fresh one replaces it; nothing outlives the model-owning
process."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess, start_server

WORKERS = ["--workers", "2"]


def _records(server: ServerProcess, message: str) -> list[dict[str, object]]:
    server.drain_logs()
    return [r for r in server.logs if r.get("message") == message]


def _fork_server_pid(server: ServerProcess) -> int:
    (started,) = _records(server, "fork server started")
    return int(str(started["pid"]))


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _command_line(pid: int) -> str:
    words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return " ".join(word.decode() for word in words if word)


def _adopted_by(pid: int, parent: int, timeout: float = 10) -> bool:
    """Whether ``parent`` adopts ``pid``: a worker is logged as started once its pid arrives,
    while the middle process that forked it may still be exiting."""
    deadline = time.monotonic() + timeout
    while _parent(pid) != parent and time.monotonic() < deadline:
        time.sleep(0.01)
    return _parent(pid) == parent


def _zombie_children(parent: int) -> list[int]:
    zombies = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError):
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
                if int(ppid) == parent and state == "Z":
                    zombies.append(int(entry.name))
    return zombies


def _logged(server: ServerProcess, message: str, timeout: float = 30) -> dict[str, object]:
    """The first record with this message, read already or still to come."""
    server.drain_logs()
    found = [r for r in server.logs if r.get("message") == message]
    return found[0] if found else server.wait_for(message, timeout=timeout)


def _memory_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {key} for {pid}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone too
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]


def _classify(server: ServerProcess) -> None:
    """A digits_cnn request answered, through whichever worker takes the connection. The
    client is closed on the thread that made it, failure or not: one left to the collector
    closes itself on whichever thread collects it, without that thread's gevent hub."""
    image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
    with httpclient.InferenceServerClient(server.http_url) as client:
        logits = client.infer("digits_cnn", [image]).as_numpy("logits")
    assert logits is not None
    assert logits.shape == (1, 10)


def test_workers_are_adopted_by_the_model_owning_process_and_share_pages() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        started = _records(server, "worker started")
        assert [r["forked"] for r in started] == [True, True]
        workers = [int(str(r["pid"])) for r in started]
        assert _parent(fork_server) == server.process.pid
        # forked through a middle process that exits: the workers are the server's children,
        # as fresh interpreters would be, and outlive the fork server
        assert [_parent(pid) for pid in workers] == [server.process.pid] * 2
        assert Path(f"/proc/{fork_server}/comm").read_text() == "bs-fork-server\n"
        assert _command_line(fork_server) == "batchserve: fork server"
        for record in started:  # what ps, top and pgrep show, a worker by its slot
            comm = Path(f"/proc/{record['pid']}/comm").read_text()
            assert comm == f"bs-worker-{record['worker']}\n"
            assert (
                _command_line(int(str(record["pid"]))) == f"batchserve: worker {record['worker']}"
            )
        assert "serve" in _command_line(server.process.pid).split()  # the server's, as started
        _classify(server)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the server's to act on
            os.kill(fork_server, sig)
        time.sleep(0.3)
        assert _alive(fork_server)
        for pid in workers:  # forked after the imports: most of a worker's pages are shared
            assert _memory_mib(pid, "Pss") < 0.6 * _memory_mib(pid, "Rss"), pid
    finally:
        assert server.stop() == 0
    _wait_gone([fork_server, *workers])


def test_a_killed_worker_is_forked_again_and_reported_killed() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        killed = int(str(_records(server, "worker started")[0]["pid"]))
        os.kill(killed, signal.SIGKILL)
        replaced = server.wait_for("worker started", timeout=30)
        assert replaced["forked"] is True
        assert _adopted_by(int(str(replaced["pid"])), server.process.pid)
        (exited,) = [r for r in server.logs if str(r.get("message")).startswith("worker exited")]
        assert (exited["pid"], exited["exit_code"]) == (killed, -signal.SIGKILL)
        _classify(server)
    finally:
        assert server.stop() == 0


def test_a_worker_whose_fork_failed_leaves_no_zombie_and_its_fresh_replacement_serves() -> None:
    """The middle process cannot take the new worker's pidfd (the fork server is out of
    descriptors): it kills the worker and exits, and the killed worker, adopted by the
    model-owning process, stayed a zombie there for the server's life. It is reaped; the
    worker started afresh in its place is left to its own waiter, which sees it die."""
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{fork_server}/fd")) != 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # at rest, 0, 1, 2 and its socket: not still closing a fork's
        used = {int(fd) for fd in os.listdir(f"/proc/{fork_server}/fd")}
        free = [fd for fd in range(len(used) + 4) if fd not in used]
        _, hard = resource.prlimit(fork_server, resource.RLIMIT_NOFILE)
        # room for the three descriptors a fork is sent, none for the worker's pidfd
        resource.prlimit(fork_server, resource.RLIMIT_NOFILE, (free[3], hard))
        os.kill(int(str(_records(server, "worker started")[0]["pid"])), signal.SIGKILL)
        assert server.wait_for("worker started afresh", timeout=30)["reason"] == "fork failed"
        fresh = server.wait_for("worker started", timeout=30)
        assert fresh["forked"] is False
        reaped = _logged(server, "an orphaned process was reaped")
        assert reaped["process_name"] == "bs-fork-server"  # killed before it took a worker's name
        assert _zombie_children(server.process.pid) == []
        for _ in range(8):
            _classify(server)
        resource.prlimit(fork_server, resource.RLIMIT_NOFILE, (hard, hard))
        os.kill(int(str(fresh["pid"])), signal.SIGKILL)
        replaced = server.wait_for("worker started", timeout=30)  # its death was seen
        assert replaced["forked"] is True
        exits = [r for r in server.logs if str(r.get("message")).startswith("worker exited")]
        assert [(r["pid"], r["exit_code"]) for r in exits][-1] == (fresh["pid"], -signal.SIGKILL)
        assert _zombie_children(server.process.pid) == []
    finally:
        assert server.stop() == 0


def _classify_until(server: ServerProcess, stop: threading.Event, failures: list[str]) -> int:
    """Requests one after another until ``stop``; each failure's text into ``failures``."""
    answered = 0
    while not stop.is_set():
        try:
            _classify(server)
            answered += 1
        except Exception as exc:  # every failure is the finding
            failures.append(repr(exc))
    return answered


def test_a_killed_fork_server_disturbs_no_request_and_a_fresh_one_forks() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        workers = [int(str(r["pid"])) for r in _records(server, "worker started")]
        stop, failures = threading.Event(), []
        with ThreadPoolExecutor(2) as pool:
            load = [pool.submit(_classify_until, server, stop, failures) for _ in range(2)]
            time.sleep(0.5)
            os.kill(fork_server, signal.SIGKILL)
            server.wait_for(
                "the fork server exited; its workers serve on and a fresh one replaces it",
                timeout=30,
            )
            fresh = server.wait_for("fork server started", timeout=30)
            time.sleep(0.5)
            stop.set()
            answered = sum(future.result() for future in load)
        assert failures == []
        assert answered > 20
        assert all(_alive(pid) for pid in workers)  # the same workers served throughout
        assert not Path(f"/proc/{fork_server}").exists()  # reaped, not left a zombie
        assert fresh["forked"] is False  # started by name: this process runs threads now
        assert _parent(int(str(fresh["pid"]))) == server.process.pid
        os.kill(workers[0], signal.SIGKILL)
        replaced = server.wait_for("worker started", timeout=60)
        assert replaced["forked"] is True  # by the fresh fork server, once it has imported
        assert _adopted_by(int(str(replaced["pid"])), server.process.pid)
        for _ in range(8):  # whichever worker takes each connection answers
            _classify(server)
    finally:
        assert server.stop() == 0


def test_a_stopped_fork_server_does_not_hold_the_server_s_exit() -> None:
    """A fork server stopped (SIGSTOP, a debugger) held SIGTERM's exit for as long as it
    stayed stopped: the model-owning process waited to reap it after the drain."""
    server = start_server(extra_args=WORKERS)
    fork_server = _fork_server_pid(server)
    os.kill(fork_server, signal.SIGSTOP)
    started = time.monotonic()
    try:
        code = server.stop(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(fork_server, signal.SIGCONT)
    assert code == 0
    assert time.monotonic() - started < 10
    _wait_gone([fork_server])


def test_nothing_outlives_a_killed_model_owning_process() -> None:
    server = start_server(extra_args=WORKERS)
    fork_server = _fork_server_pid(server)
    workers = [int(str(r["pid"])) for r in _records(server, "worker started")]
    server.process.kill()
    assert server.process.wait(10) != 0
    _wait_gone([fork_server, *workers])
    server.stop()
