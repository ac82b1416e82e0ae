"""Run PyTriton from a peers environment on this run's models, through the same perf_analyzer.

The environment is ``DIR/venv`` holding nvidia-pytriton and onnxruntime, as the peers setup
builds it. Without one, the report says the peers were not run and quotes no peer figure.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench import repo, servers
from bench.common import ROOT
from bench.records import PYTRITON

if TYPE_CHECKING:
    from bench.run import Runner, Subject

MAX_BATCH = 64
QUEUE_DELAY_US = 1000
STARTS = 2
START_TIMEOUT_S = 180.0
PROBE = "import importlib.metadata as m, sysconfig; print(m.version('nvidia-pytriton'), sysconfig.get_config_var('LIBDIR'))"  # noqa: E501


def measure(peers: Path, subjects: Sequence[Subject], runner: Runner) -> None:
    """Every model on PyTriton at the run's concurrencies, both protocols."""
    found = probe(peers / "venv" / "bin" / "python")
    if found is None:
        runner.results.peers_note = (
            f"Peers were not run: no Python environment with nvidia-pytriton under "
            f"{peers.name}/venv. No peer figures are quoted."
        )
        return
    python, version, libdir = found
    runner.results.peers_note = (
        f"PyTriton {version} (Triton's core and Python backend) serving the same ONNX files with "
        f"ONNX Runtime in one Python process; dynamic batching, max batch {MAX_BATCH}, queue "
        f"delay {QUEUE_DELAY_US} µs; measured by the same perf_analyzer as batchserve."
    )
    for s in subjects:  # one model per server, as batchserve is measured
        serve = partial(pytriton, python, libdir, s)
        runner.guarded(serve, PYTRITON, s, "on", ("http", "grpc"))


def probe(python: Path) -> tuple[Path, str, str] | None:
    """(python, PyTriton version, its libpython directory), or None when not usable."""
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None
    version, libdir = done.stdout.split()
    return python, version, libdir


@contextmanager
def pytriton(python: Path, libdir: str, s: Subject) -> Iterator[servers.Running]:
    ports = {name: free_port() for name in ("http", "grpc", "metrics")}
    command = [str(python), "-m", "bench.peers.pytriton_serve",
               f"--model={s.name}={repo.onnx_file(s.directory)}",
               f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}",
               f"--metrics-port={ports['metrics']}", f"--max-batch={MAX_BATCH}",
               f"--queue-delay-us={QUEUE_DELAY_US}"]  # fmt: skip
    # Triton's Python-backend stub must load this interpreter's libpython, not the system's.
    env = {**os.environ, "LD_LIBRARY_PATH": libdir, "PYTHONPATH": str(ROOT)}
    process = start(command, env)
    try:
        yield servers.Running(PYTRITON, process, {"http": ports["http"], "grpc": ports["grpc"]})
    finally:
        servers.stop(process)
        _discard(process)


def start(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """PyTriton in a process group of its own, started again once if it is not ready within
    START_TIMEOUT_S: its startup has hung here for good (a full run lost one model's peer
    figures to the ten-minute wait), and a second start came up as usual."""
    for attempt in range(1, STARTS + 1):
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            servers.wait_for_ready_line(process, "PyTriton", START_TIMEOUT_S)
            return process
        except RuntimeError:
            _discard(process)
            if attempt == STARTS:
                raise
            print(f"  PyTriton was not ready within {START_TIMEOUT_S:g} s; starting it again")
    raise AssertionError("unreachable")


def _discard(process: subprocess.Popen[str]) -> None:
    """Whatever is left of PyTriton's group (tritonserver and its backend stubs), and the
    pipe it wrote to."""
    servers.kill_group(process.pid)
    if process.stdout is not None:
        process.stdout.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
