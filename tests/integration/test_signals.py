"""Lifecycle on a real server: a second SIGINT hurries the drain without losing an accepted
request, a hangup of the whole process group drains the server and its workers, a SIGTERM
during start-up stops loading the models still to load, and threads racing loads and unloads
leave the memory where it was."""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.server import (
    CONTROL_TOKEN,
    ServerProcess,
    metric,
    rss_mib,
    start_server,
)
from tests.integration.slow_model import write_slow_model
from tests.integration.test_faults import (
    assert_slow_answer,
    assert_slow_grpc_answer,
    slow_grpc_request,
    slow_http,
    wait_until,
)

BLOCK_ITERATIONS = 500
"""The request holding the only instance while the signals come (~5 s on an idle core): long
enough that the six queued requests are all in the queue before it ends, even while other
work takes the cores (at ~1.5 s a busy machine let it finish first, and the queue never
reached six)."""
QUEUED = 3
"""Requests per protocol waiting behind it."""
SHUTDOWN_DELAY = 60.0
"""Longer than the test may take: exiting at all shows the second signal skipped it."""
CONTROL_HEADERS = {"Authorization": f"Bearer {CONTROL_TOKEN}"}


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2 * QUEUED + 1) as executor:
        yield executor


def _grpc_infer(server: ServerProcess, iterations: int) -> service_pb2.ModelInferResponse:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response: service_pb2.ModelInferResponse = stub.ModelInfer(
            slow_grpc_request(iterations), timeout=30
        )
        return response


def _exit_code(server: ServerProcess, timeout: float) -> int | None:
    """The exit code within ``timeout`` seconds, or None (the server is then killed)."""
    try:
        return server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return None
    finally:
        server.stop()


def test_a_second_sigint_hurries_the_drain_and_answers_every_accepted_request(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    write_slow_model(tmp_path, "slow", max_queue_size=2 * QUEUED)
    args = ["--shutdown-delay", str(SHUTDOWN_DELAY), "--shutdown-timeout", "20"]
    server = start_server(tmp_path, args)
    blocker = pool.submit(slow_http, server, BLOCK_ITERATIONS)
    wait_until(lambda: metric(server, "batchserve_busy_instances", model="slow") == 1)
    http_queued = [pool.submit(slow_http, server, 1) for _ in range(QUEUED)]
    grpc_queued = [pool.submit(_grpc_infer, server, 1) for _ in range(QUEUED)]
    wait_until(lambda: metric(server, "batchserve_queue_depth", model="slow") == 2 * QUEUED)

    started = time.monotonic()
    server.process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    server.process.send_signal(signal.SIGINT)
    code = _exit_code(server, timeout=25)
    elapsed = time.monotonic() - started

    assert code == 0, [r["message"] for r in server.logs]
    assert elapsed < SHUTDOWN_DELAY / 2
    assert_slow_answer(blocker.result(timeout=5))
    for http in http_queued:
        assert_slow_answer(http.result(timeout=5))
    for rpc in grpc_queued:
        assert_slow_grpc_answer(rpc.result(timeout=5))
    messages = [str(r.get("message", "")) for r in server.logs]
    assert not [m for m in messages if "Traceback" in m], messages
    assert any(m.startswith("drain hurried") for m in messages), messages
    finals = [r for r in server.logs if r.get("message") == "final statistics"]
    assert [(r["success"], r["fail"]) for r in finals] == [(1 + 2 * QUEUED, 0)]


def test_a_hangup_of_the_whole_process_group_drains_the_server_and_its_workers(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """SIGHUP, as a closing terminal sends it to every process of the group, killed the
    server and each worker at once, dropping what they had accepted; it now stops the
    server as SIGTERM does, and the workers leave the drain to it."""
    write_slow_model(tmp_path, "slow", max_queue_size=2 * QUEUED)
    args = ["--workers", "2", "--shutdown-timeout", "20"]
    server = start_server(tmp_path, args, wrapper=["setsid"])  # a process group of its own
    assert os.getpgid(server.process.pid) == server.process.pid
    blocker = pool.submit(slow_http, server, BLOCK_ITERATIONS)
    wait_until(lambda: metric(server, "batchserve_busy_instances", model="slow") == 1)
    queued = [pool.submit(_grpc_infer, server, 1) for _ in range(QUEUED)]
    wait_until(lambda: metric(server, "batchserve_queue_depth", model="slow") == QUEUED)
    os.killpg(server.process.pid, signal.SIGHUP)
    code = _exit_code(server, timeout=25)
    assert code == 0, [r["message"] for r in server.logs]
    assert_slow_answer(blocker.result(timeout=5))
    for rpc in queued:
        assert_slow_grpc_answer(rpc.result(timeout=5))
    (requested,) = [r for r in server.logs if r.get("message") == "stop requested"]
    assert requested["signal"] == "SIGHUP"
    messages = [str(r.get("message", "")) for r in server.logs]
    assert not [m for m in messages if m.startswith("worker exited")], messages


# start-up ---------------------------------------------------------------------------------
MODELS = ("slow_a", "slow_b", "slow_c")
WARMUP_ITERATIONS = 30
"""One warm-up run (~0.1 s): what a stop waits for, at most, of the load under way."""
WARMUP_COUNT = 100
"""Runs per load: ~8 s a model, so loading them all takes far longer than the stop may."""


def _write_slow_to_load(repo: Path, name: str) -> None:
    """The slow model with a ``model_warmup`` that runs it WARMUP_COUNT times at load."""
    write_slow_model(repo, name, max_queue_size=1)
    (repo / name / "warmup").mkdir()
    iterations = np.array([WARMUP_ITERATIONS], dtype=np.int64).tobytes()
    (repo / name / "warmup" / "iterations").write_bytes(iterations)
    with (repo / name / "config.pbtxt").open("a") as config:
        config.write(
            f'model_warmup [{{ name: "slow_start" batch_size: 1 count: {WARMUP_COUNT}\n'
            '  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [4] zero_data: true } }\n'
            '  inputs { key: "iterations" value: { data_type: TYPE_INT64 dims: [1] '
            'input_data_file: "iterations" } } }]\n'
        )


def test_sigterm_during_start_up_stops_loading_and_exits_promptly(tmp_path: Path) -> None:
    for name in MODELS:
        _write_slow_to_load(tmp_path, name)
    server = start_server(tmp_path, ["--shutdown-delay", "30"], wait_ready=False)
    time.sleep(1.0)  # listening, then loading the first model: into its warm-up

    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = _exit_code(server, timeout=15)
    elapsed = time.monotonic() - started

    assert code == 0, [r["message"] for r in server.logs]
    assert elapsed < 8, elapsed
    loading = [r["model"] for r in server.logs if r.get("message") == "loading model"]
    assert loading == [MODELS[0]]
    assert not [r for r in server.logs if r.get("message") == "model ready"]
    stopped = [r for r in server.logs if r.get("message") == "start-up stopped: models not loaded"]
    assert [r["models"] for r in stopped] == [list(MODELS)]


# racing loads and unloads ---------------------------------------------------------------
RACERS = 8
ROUNDS = 3
OPERATIONS = 3
"""Loads or unloads each racer sends per round (chosen at random, seeded)."""
MAX_GROWTH_MB = 12
"""Median RSS growth allowed over the rounds, the model unloaded. Before the allocator was
set (``malloc_tuning``) the medians were 31 and 44 MB; after, 0-1 MB."""


def _race(server: ServerProcess, seed: int) -> list[int]:
    chooser = random.Random(seed)
    url = f"http://{server.http_url}/v2/repository/models/char_lstm"
    with httpx.Client(headers=CONTROL_HEADERS, timeout=60) as client:
        return [
            client.post(f"{url}/{chooser.choice(('load', 'unload'))}").status_code
            for _ in range(OPERATIONS)
        ]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_racing_loads_and_unloads_do_not_ratchet_up_memory(
    explicit_server: ServerProcess,
) -> None:
    url = f"http://{explicit_server.http_url}/v2/repository/models/char_lstm"
    for action in ("load", "unload"):  # the first load's one-time set-up is not growth
        assert httpx.post(f"{url}/{action}", headers=CONTROL_HEADERS, timeout=60).is_success
    start = rss_mib(explicit_server.process.pid)
    growth = []
    with ThreadPoolExecutor(RACERS) as pool:
        for round_ in range(ROUNDS):
            seeds = [round_ * RACERS + racer for racer in range(RACERS)]
            codes = [code for codes in pool.map(partial(_race, explicit_server), seeds)
                     for code in codes]  # fmt: skip
            assert set(codes) == {200}, codes
            assert httpx.post(f"{url}/unload", headers=CONTROL_HEADERS, timeout=60).is_success
            growth.append(rss_mib(explicit_server.process.pid) - start)
    assert statistics.median(growth) < MAX_GROWTH_MB, growth
