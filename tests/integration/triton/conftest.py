"""Servers for the Triton-examples suite: one on the built repository, one in explicit mode;
each as one process and as two request-handling workers (``--workers 2``), since NVIDIA's
client programs must work against both alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.server import ServerProcess, start_server
from tests.integration.triton.models import MODEL_NAMES, write_repository

SETTLED = ("model ready", "model failed to load")
HANDLING = {"one process": ["--workers", "1"], "two workers": ["--workers", "2"]}
"""How requests are handled: ``serve``'s arguments for each. One process is asked for by
name: the default (``auto``) starts workers on a machine with more than two cores."""


@pytest.fixture(scope="session")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Triton-equivalent model repository, built once per session."""
    return write_repository(tmp_path_factory.mktemp("triton_repo"))


def _wait_settled(server: ServerProcess, timeout: float = 90.0) -> None:
    """Wait until every model has loaded or failed: one that fails fails only its own tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.drain_logs()
        settled = {r.get("model") for r in server.logs if r.get("message") in SETTLED}
        if settled >= set(MODEL_NAMES):
            return
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited ({server.process.returncode}) while loading")
        time.sleep(0.1)
    raise TimeoutError(f"models not settled within {timeout} s: {server.logs[-5:]}")


@pytest.fixture(scope="session", params=list(HANDLING))
def handling(request: pytest.FixtureRequest) -> list[str]:
    """Every test of the suite runs against both: one process, then two workers."""
    return HANDLING[request.param]


@contextmanager
def _stopped_on_failure(server: ServerProcess) -> Iterator[None]:
    """A fixture's checks that fail leave no server running behind them."""
    try:
        yield
    except BaseException:
        server.process.kill()
        server.stop()
        raise


def _check_workers(server: ServerProcess, handling: list[str]) -> None:
    """The server runs as many workers as asked (none for one process)."""
    server.drain_logs()
    started = sum(record.get("message") == "worker started" for record in server.logs)
    asked = int(handling[handling.index("--workers") + 1])
    assert started == (asked if asked > 1 else 0), server.logs[-5:]


@pytest.fixture(scope="session")
def triton_server(triton_repo: Path, handling: list[str]) -> Iterator[ServerProcess]:
    """batchserve serving the whole repository, as ``tritonserver --model-repository`` would.

    Not waiting for readiness: a model another feature branch still has to make load
    (it is logged with its reason) fails the tests that use it, not the whole suite.
    """
    server = start_server(triton_repo, handling, wait_ready=False)
    with _stopped_on_failure(server):
        _wait_settled(server)
        _check_workers(server, handling)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def control_server(triton_repo: Path, handling: list[str]) -> Iterator[ServerProcess]:
    """``--model-control-mode explicit`` with nothing loaded, for the model-control examples."""
    server = start_server(triton_repo, ["--model-control-mode", "explicit", *handling])
    with _stopped_on_failure(server):
        _check_workers(server, handling)
    yield server
    assert server.stop() == 0
