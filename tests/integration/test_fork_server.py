"""``--workers 2`` forks its workers from the fork server: a copy of the model-owning process
made after its imports, before it ran anything. The workers are its children and share its
imported pages; a killed worker is forked again; a killed fork server takes its workers
with it, and fresh interpreters replace them; nothing outlives the model-owning process."""

from __future__ import annotations

import os
import signal
import time
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
    """A digits_cnn request answered, through whichever worker takes the connection."""
    client = httpclient.InferenceServerClient(server.http_url)
    image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
    logits = client.infer("digits_cnn", [image]).as_numpy("logits")
    assert logits is not None
    assert logits.shape == (1, 10)
    client.close()


def test_workers_are_the_fork_server_s_children_and_share_its_pages() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        started = _records(server, "worker started")
        assert [r["forked"] for r in started] == [True, True]
        workers = [int(str(r["pid"])) for r in started]
        assert _parent(fork_server) == server.process.pid
        assert [_parent(pid) for pid in workers] == [fork_server, fork_server]
        assert Path(f"/proc/{fork_server}/comm").read_text() == "bs-fork-server\n"
        for record in started:  # what ps and top show, a worker by its slot
            comm = Path(f"/proc/{record['pid']}/comm").read_text()
            assert comm == f"bs-worker-{record['worker']}\n"
        _classify(server)
        for pid in workers:  # forked after the imports: most of a worker's pages are shared
            assert _memory_mib(pid, "Pss") < 0.6 * _memory_mib(pid, "Rss"), pid
    finally:
        assert server.stop() == 0
    _wait_gone([fork_server, *workers])


def test_a_killed_worker_is_forked_again_and_reported_killed() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        killed = int(str(_records(server, "worker started")[0]["pid"]))
        os.kill(killed, signal.SIGKILL)
        replaced = server.wait_for("worker started", timeout=30)
        assert replaced["forked"] is True
        assert _parent(int(str(replaced["pid"]))) == fork_server
        (exited,) = [r for r in server.logs if str(r.get("message")).startswith("worker exited")]
        assert (exited["pid"], exited["exit_code"]) == (killed, -signal.SIGKILL)
        _classify(server)
    finally:
        assert server.stop() == 0


def test_a_killed_fork_server_takes_its_workers_and_fresh_interpreters_serve() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        fork_server = _fork_server_pid(server)
        forked = [int(str(r["pid"])) for r in _records(server, "worker started")]
        os.kill(fork_server, signal.SIGKILL)
        server.wait_for(
            "the fork server exited; its workers exit with it and are replaced by fresh "
            "interpreters",
            timeout=30,
        )
        _wait_gone(forked)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{fork_server}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{fork_server}").exists()  # reaped, not left a zombie
        server.wait_for("worker started", timeout=60)
        replacement = server.wait_for("worker started", timeout=60)
        fresh = [r for r in _records(server, "worker started") if r["forked"] is False]
        assert len(fresh) == 2, fresh
        assert _parent(int(str(replacement["pid"]))) == server.process.pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # each fresh worker listens once it has imported
            try:
                _classify(server)
                break
            except Exception:  # a connection refused while they start
                time.sleep(0.2)
        for _ in range(8):  # whichever worker takes each connection answers
            _classify(server)
    finally:
        assert server.stop() == 0


def test_nothing_outlives_a_killed_model_owning_process() -> None:
    server = start_server(extra_args=WORKERS)
    fork_server = _fork_server_pid(server)
    workers = [int(str(r["pid"])) for r in _records(server, "worker started")]
    server.process.kill()
    assert server.process.wait(10) != 0
    _wait_gone([fork_server, *workers])
    server.stop()
