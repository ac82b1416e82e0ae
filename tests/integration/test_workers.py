"""``--workers 2``: two request-handling processes share the ports and hand requests to the
one process that runs the models. Real tritonclient and perf_analyzer against it; one set
of statistics; a worker killed under load; the model-owning process killed; SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import resource
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.zoo.char_lstm import VOCAB_SIZE
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import (
    CONTROL_TOKEN,
    MODEL_REPO,
    ServerProcess,
    metric,
    run_perf_analyzer,
    start_server,
)

WORKERS = ["--workers", "2"]


@pytest.fixture(scope="module")
def workers_server() -> Iterator[ServerProcess]:
    server = start_server(extra_args=WORKERS)
    yield server
    assert server.stop() == 0


def _images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 1, 8, 8), dtype=np.float32)


def _reference(images: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(MODEL_REPO / "digits_cnn" / "1" / "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"image": images}), strict=True))


def _stats_success(server: ServerProcess) -> int:
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("digits_cnn")
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_tritonclient_gets_the_models_answers_over_both_protocols(
    workers_server: ServerProcess,
) -> None:
    images = _images(5, seed=1)
    expected = _reference(images)
    for module, url in (
        (httpclient, workers_server.http_url),
        (grpcclient, workers_server.grpc_url),
    ):
        client = module.InferenceServerClient(url)
        assert client.is_server_ready()
        assert client.get_model_metadata("digits_cnn")
        tensor = module.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        result = client.infer("digits_cnn", [tensor])
        for name, value in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), value, rtol=1e-5, atol=1e-6)


def test_requests_over_many_connections_reach_both_workers_and_are_counted_once(
    workers_server: ServerProcess,
) -> None:
    before = _stats_success(workers_server)
    before_metric = metric(workers_server, "batchserve_requests_total", outcome="success")
    images = _images(1, seed=2)
    sent = 0
    for _ in range(40):  # a new connection each time: the kernel spreads them
        for module, url in ((httpclient, workers_server.http_url),
                            (grpcclient, workers_server.grpc_url)):  # fmt: skip
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("image", [1, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(images)
            client.infer("digits_cnn", [tensor])
            client.close()
            sent += 1
    assert _stats_success(workers_server) - before == sent
    grpc_stats = grpcclient.InferenceServerClient(workers_server.grpc_url).get_inference_statistics(
        "digits_cnn", as_json=True
    )
    assert int(grpc_stats["model_stats"][0]["inference_stats"]["success"]["count"]) == before + sent
    after_metric = metric(workers_server, "batchserve_requests_total", outcome="success")
    assert after_metric - before_metric == sent
    shares = [metric(workers_server, "batchserve_worker_requests_total", worker=str(i))
              for i in range(2)]  # fmt: skip
    assert all(share > 0 for share in shares), shares


def test_answers_forwarded_from_the_model_owning_process_carry_one_date(
    workers_server: ServerProcess,
) -> None:
    """Health, metadata and generate_stream go to the model-owning process whole; its own
    ``Date`` came back beside the worker's, two where RFC 9110 allows one."""
    for method, path, body in [
        ("GET", "/v2/health/ready", None),
        ("GET", "/v2/models/digits_cnn", None),
        ("POST", "/v2/models/square_int32/generate_stream", b'{"IN": 2}'),
    ]:
        connection = http.client.HTTPConnection(workers_server.http_url, timeout=30)
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            response.read()
        finally:
            connection.close()
        assert response.status == 200, path
        assert len(response.headers.get_all("date") or []) == 1, path


def test_bad_requests_get_the_same_answers_and_are_counted(workers_server: ServerProcess) -> None:
    before = metric(workers_server, "batchserve_requests_total", outcome="failure")
    response = httpx.post(
        f"http://{workers_server.http_url}/v2/models/digits_cnn/infer",
        json={"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 9],
                          "data": [0.0] * 72}]},
    )  # fmt: skip
    assert response.status_code == 400
    assert "input 'image': shape [1, 1, 8, 9] does not match" in response.json()["error"]
    client = grpcclient.InferenceServerClient(workers_server.grpc_url)
    tensor = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
    with pytest.raises(Exception, match=r"unknown model|no available versions"):
        client.infer("no_such_model", [tensor])
    # a priority past the model's levels runs at its default, as in Triton
    assert client.infer("digits_cnn", [tensor], priority=99).as_numpy("logits").shape == (1, 10)
    with pytest.raises(Exception, match="model 'digits_cnn' does not use sequence batching"):
        client.infer("digits_cnn", [tensor], sequence_id=5, sequence_start=True)
    assert metric(workers_server, "batchserve_requests_total", outcome="failure") - before >= 2


def test_perf_analyzer_runs_cleanly_against_two_workers(workers_server: ServerProcess) -> None:
    for protocol, url in (("http", workers_server.http_url), ("grpc", workers_server.grpc_url)):
        run_perf_analyzer("digits_cnn", protocol, url, "--concurrency-range", "8")


def test_what_a_worker_refused_is_in_the_next_scrape(workers_server: ServerProcess) -> None:
    """Each worker counts its own refusals; a scrape asks every worker for its counts first,
    so that what a client has just been refused is counted there, as with one process (the
    workers' periodic report alone lags by up to a second)."""
    malformed = metric(workers_server, "batchserve_refusals_total", reason="malformed")
    failed = metric(workers_server, "batchserve_grpc_core_calls_failed_total")
    for _ in range(4):  # new connections: both workers
        with socket.create_connection(("127.0.0.1", workers_server.http_port), 10) as sock:
            sock.sendall(b"HELLO\x00 / HTTP/1.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 400")
        with grpc.insecure_channel(workers_server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(service_pb2.ModelInferRequest(model_name="nope"), timeout=10)
            assert caught.value.code() != grpc.StatusCode.OK
    assert metric(workers_server, "batchserve_refusals_total", reason="malformed") == malformed + 4
    assert metric(workers_server, "batchserve_grpc_core_calls_failed_total") == failed + 4


def test_a_request_sent_after_a_reload_is_judged_by_the_new_config(tmp_path: Path) -> None:
    """Each worker keeps a copy of a model's config to validate with. A request sent after a
    reload's answer, through either worker, must meet the new config, not be refused by the
    old copy (a batch of 8 after the cap went from 4 back to 64)."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    server = start_server(
        tmp_path, ["--model-control-mode", "explicit", "--load-model", "digits_cnn", *WORKERS],
        extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN},
    )  # fmt: skip
    headers = {"authorization": f"Bearer {CONTROL_TOKEN}"}
    images = _images(8, seed=9)
    expected = _reference(images)["probabilities"]

    def infer(module: Any, url: str) -> np.ndarray:
        client = module.InferenceServerClient(url)  # a new connection: either worker
        tensor = module.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        try:
            return np.asarray(client.infer("digits_cnn", [tensor]).as_numpy("probabilities"))
        finally:
            client.close()

    try:
        control = httpclient.InferenceServerClient(server.http_url)
        for module, url in [(httpclient, server.http_url), (grpcclient, server.grpc_url)] * 4:
            infer(module, url)  # both workers hold the shipped config's copy
        for _ in range(8):
            control.load_model("digits_cnn", config='{"max_batch_size": 4}', headers=headers)
            with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
                infer(httpclient, server.http_url)
            control.load_model("digits_cnn", headers=headers)
            for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
                np.testing.assert_allclose(infer(module, url), expected, rtol=1e-5, atol=1e-6)
    finally:
        assert server.stop() == 0


def _http_load(server: ServerProcess, stop: threading.Event, seen: Counter[str]) -> None:
    images = _images(1, seed=3)
    while not stop.is_set():
        try:  # a fresh connection each time: some land on the worker about to die
            with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as client:
                tensor = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
                tensor.set_data_from_numpy(images)
                client.infer("digits_cnn", [tensor])
            seen["ok"] += 1
        except Exception as error:  # the dead worker's connections close: an error, at once
            seen[type(error).__name__] += 1


def _grpc_load(server: ServerProcess, stop: threading.Event, seen: Counter[str]) -> None:
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(_images(1, seed=4).tobytes())
    while not stop.is_set():
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            try:
                stub.ModelInfer(request, timeout=30)
                seen["ok"] += 1
            except grpc.RpcError as error:
                seen[error.code().name] += 1


def _arenas_mapped(server: ServerProcess) -> int:
    """The workers' arenas the model-owning process maps (two a worker)."""
    maps = Path(f"/proc/{server.process.pid}/maps").read_text().splitlines()
    return sum("memfd:batchserve-worker" in line for line in maps)


@contextlib.contextmanager
def _under_load(server: ServerProcess) -> Iterator[Counter[str]]:
    """An HTTP and a gRPC client sending back to back while the block runs: what they got,
    by outcome."""
    stop = threading.Event()
    seen: Counter[str] = Counter()
    threads = [threading.Thread(target=loop, args=(server, stop, seen))
               for loop in (_http_load, _grpc_load)]  # fmt: skip
    for thread in threads:
        thread.start()
    try:
        yield seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(40)


def test_a_stop_signal_sent_to_a_worker_alone_is_ignored(workers_server: ServerProcess) -> None:
    """Stop signals are the model-owning process's (a terminal's Ctrl-C reaches the whole
    group); a worker sent one alone keeps serving, and nothing it had is lost."""
    pids = workers_server.worker_pids()
    with _under_load(workers_server) as seen:
        time.sleep(0.5)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os.kill(pids[0], sig)
            time.sleep(0.5)
    assert set(seen) == {"ok"}, seen
    assert seen["ok"] > 10
    os.kill(pids[0], 0)  # still there
    assert workers_server.worker_pids() == pids
    assert not [r for r in workers_server.logs if r.get("message", "").startswith("worker exited")]


def test_a_killed_worker_is_replaced_and_no_request_hangs() -> None:
    server = start_server(extra_args=WORKERS)
    try:
        pids = server.worker_pids()
        assert len(pids) == 2
        assert _arenas_mapped(server) == 4
        stop = threading.Event()
        seen: Counter[str] = Counter()
        threads = [threading.Thread(target=loop, args=(server, stop, seen))
                   for loop in (_http_load, _http_load, _grpc_load, _grpc_load)]  # fmt: skip
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        os.kill(pids[0], signal.SIGKILL)
        replaced = server.wait_for("worker started", timeout=60)
        assert int(str(replaced["worker"])) == 0
        assert int(str(replaced["pid"])) != pids[0]
        assert replaced["forked"] is True  # by the fork server, as the first ones were
        time.sleep(1.5)
        ok_before_stop = seen["ok"]
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(40)
        assert not any(thread.is_alive() for thread in threads), "a request hung"
        assert seen["ok"] > ok_before_stop, seen  # still serving after the replacement
        assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
        exited = [r for r in server.logs if r.get("message", "").startswith("worker exited")]
        assert exited
        assert exited[0]["exit_code"] == -signal.SIGKILL
        # the dead worker's two 64 MiB arenas are unmapped, not left to the collector
        deadline = time.monotonic() + 20
        while _arenas_mapped(server) != 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _arenas_mapped(server) == 4
    finally:
        assert server.stop() == 0
    # a worker started while grpc's threads were busy: grpc core wrote a plain-text line
    # about its fork handlers to stderr, which a JSON log pipeline cannot read
    unstructured = [r["message"] for r in server.logs if "level" not in r]
    assert not unstructured, unstructured


def _infer_on_new_connections(server: ServerProcess, count: int, seed: int) -> None:
    """``count`` HTTP requests, each on a new connection: the kernel spreads them over the
    workers listening then."""
    images = _images(1, seed=seed)
    for _ in range(count):
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=10)
        tensor = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
        tensor.set_data_from_numpy(images)
        client.infer("digits_cnn", [tensor])
        client.close()


def _logged_exit(server: ServerProcess) -> bool:
    server.drain_logs()
    return any(str(r.get("message", "")).startswith("worker exited") for r in server.logs)


def test_a_worker_awaiting_its_replacement_is_counted_once_and_a_stop_exits_0() -> None:
    """A dead worker waits a second for its replacement. Its hand-overs were counted twice
    meanwhile (the counter then fell when the replacement came), and a stop signal then
    made the server exit 1: the drain was judged by that worker's SIGKILL."""
    server = start_server(extra_args=WORKERS)
    try:
        pids = server.worker_pids()
        _infer_on_new_connections(server, 30, seed=5)  # both workers hand some over
        handed = metric(server, "batchserve_worker_requests_total")
        assert handed == 30
        assert metric(server, "batchserve_worker_requests_total", worker="0") > 0
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not _logged_exit(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _logged_exit(server)
        assert metric(server, "batchserve_worker_requests_total") == handed  # in the pause
        server.process.send_signal(signal.SIGTERM)  # still within the second's pause
        code = server.process.wait(60)
    finally:
        server.stop()
    assert code == 0
    assert not [r for r in server.logs if r.get("message") == "worker started"
                and int(str(r["pid"])) not in pids.values()]  # fmt: skip


def test_a_worker_that_cannot_be_started_is_tried_again() -> None:
    """Out of descriptors (a limit reached), a replacement's start failed and its error ended
    the slot's watcher: the server served on a worker short for good and said nothing."""
    server = start_server(extra_args=WORKERS)
    pid = server.process.pid
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    try:
        pids = server.worker_pids()
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not _logged_exit(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        open_now = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now - 2, limits[1]))
        failed = server.wait_for("a worker could not be started; trying again", timeout=30)
        assert "Too many open files" in str(failed["error"])
        assert int(str(failed["worker"])) == 0
        time.sleep(0.5)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        replaced = server.wait_for("worker started", timeout=30)
        assert int(str(replaced["worker"])) == 0
        assert int(str(replaced["pid"])) != pids[0]
        started = dict.fromkeys(("0", "1"), 0.0)
        for worker in started:
            started[worker] = metric(server, "batchserve_worker_requests_total", worker=worker)
        _infer_on_new_connections(server, 30, seed=6)  # the new one takes its share
        assert metric(server, "batchserve_worker_requests_total", worker="0") > started["0"]
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        states = [Path(f"/proc/{child}/stat").read_text().split()[2] for child in children]
        assert "Z" not in states, "a worker forked for a failed start was left unreaped"
    finally:
        if server.process.poll() is None:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        code = server.stop()
    assert code == 0


def test_a_worker_that_stops_answering_is_killed_and_replaced() -> None:
    """A worker whose event loop stops (here SIGSTOP; a deadlock or a spinning loop alike)
    kept its listening sockets: the kernel went on handing it a share of the new
    connections, each left waiting for ever. Past --worker-timeout it is killed and
    replaced; workers that answer, under load, are left alone."""
    server = start_server(extra_args=[*WORKERS, "--worker-timeout", "2"])
    try:
        pids = server.worker_pids()
        with _under_load(server) as seen:
            time.sleep(3.0)  # longer than the timeout: busy workers answer in time
        assert seen["ok"] > 0
        assert set(seen) == {"ok"}, seen
        assert server.worker_pids() == pids
        # the model-owning process itself stalled past the timeout: the answers waiting
        # unread in its sockets are no worker's fault
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(server.process.pid, signal.SIGCONT)
        time.sleep(1.5)
        assert server.worker_pids() == pids
        assert not [r for r in server.logs if r.get("message", "").startswith("worker did not")]
        os.kill(pids[0], signal.SIGSTOP)
        killed = server.wait_for(
            "worker did not answer for the worker timeout; killed, to be replaced", timeout=30
        )
        assert int(str(killed["worker"])) == 0
        assert int(str(killed["pid"])) == pids[0]
        replaced = server.wait_for("worker started", timeout=30)
        assert int(str(replaced["worker"])) == 0
        before = metric(server, "batchserve_worker_requests_total", worker="0")
        _infer_on_new_connections(server, 30, seed=7)  # the new one takes its share
        assert metric(server, "batchserve_worker_requests_total", worker="0") > before
        assert server.worker_pids()[1] == pids[1]
    finally:
        code = server.stop()
    assert code == 0


def test_workers_exit_when_the_model_owning_process_dies() -> None:
    server = start_server(extra_args=WORKERS)
    pids = list(server.worker_pids().values())
    server.process.kill()
    assert server.process.wait(10) != 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{server.http_url}/v2/health/live", timeout=2)
    server.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is gone too
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.alone  # it counts the CPU time a process gets
def test_busy_polling_keeps_the_model_owning_process_polling_too() -> None:
    """``--busy-poll-us`` with workers: the process that runs the models reads the workers'
    frames on its own loop, which must not sleep between them either."""
    server = start_server(extra_args=[*WORKERS, "--busy-poll-us", "100000"])
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(_images(1, seed=5))
        client.infer("digits_cnn", [image])
        before, started = _cpu_seconds(server.process.pid), time.monotonic()
        while time.monotonic() - started < 1.0:  # a request every 50 ms: polled through
            client.infer("digits_cnn", [image])
            time.sleep(0.05)
        used = _cpu_seconds(server.process.pid) - before
        elapsed = time.monotonic() - started
        # without polling 20 requests cost it a few ms; polling, most of a core
        assert used > 0.25 * elapsed, (used, elapsed)
    finally:
        assert server.stop() == 0


def _policies(pid: int) -> list[int]:
    """The scheduling policy of each thread of ``pid`` (those that end meanwhile left out)."""
    policies = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            policies.append(os.sched_getscheduler(int(task.name)))
        except ProcessLookupError:
            continue
    return policies


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_every_thread_of_every_process_runs_under_sched_batch(
    workers_server: ServerProcess,
) -> None:
    """The default ``--cpu-scheduling batch`` (``runtime/cpu_scheduling.py``) reaches the
    threads grpc, uvicorn and ONNX Runtime started after it, in the model-owning process and
    in each worker, once requests have run through both."""
    client = grpcclient.InferenceServerClient(workers_server.grpc_url)
    image = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(_images(1, seed=11))
    for _ in range(8):
        client.infer("digits_cnn", [image])
    (fork_server,) = [
        r["pid"] for r in workers_server.logs if r.get("message") == "fork server started"
    ]
    pids = [workers_server.process.pid, *workers_server.worker_pids().values()]
    assert len(pids) == 3
    assert set(_policies(int(str(fork_server)))) == {os.SCHED_BATCH}  # its forks start there
    for pid in pids:
        policies = _policies(pid)
        assert len(policies) > 3, pid  # grpc's threads at least
        assert set(policies) == {os.SCHED_BATCH}, (pid, policies)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_cpu_scheduling_normal_leaves_every_thread_under_the_normal_policy() -> None:
    server = start_server(
        extra_args=[*WORKERS, "--cpu-scheduling", "normal", "--model-control-mode", "explicit"]
    )
    try:
        pids = [server.process.pid, *server.worker_pids().values()]
        assert len(pids) == 3
        inherited = os.sched_getscheduler(0)  # the server starts under the test's policy
        for pid in pids:
            assert set(_policies(pid)) == {inherited}, pid
    finally:
        assert server.stop() == 0


def test_sigterm_drains_every_accepted_request_and_exits_0() -> None:
    server = start_server(extra_args=[*WORKERS, "--shutdown-delay", "0.5"])
    stop = threading.Event()
    seen: Counter[str] = Counter()
    threads = [threading.Thread(target=loop, args=(server, stop, seen))
               for loop in (_http_load, _grpc_load, _grpc_load)]  # fmt: skip
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(60)
    stop.set()
    for thread in threads:
        thread.join(40)
    server.stop()
    assert code == 0
    finals = [r for r in server.logs if r.get("message") == "final statistics"]
    answered = sum(int(str(r["success"])) for r in finals)
    assert sum(int(str(r["fail"])) for r in finals) == 0
    assert seen["ok"] == answered, seen
    assert seen["ok"] > 0


def _streamed(
    client: grpcclient.InferenceServerClient,
    model: str,
    requests: dict[str, list[grpcclient.InferInput]],
    output: str,
) -> dict[str, np.ndarray]:
    """Each request sent down one ModelStreamInfer stream under its id; ``output`` of each
    answer, by the id it came back with."""
    answers: dict[str, np.ndarray] = {}
    done = threading.Event()

    def on_answer(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        assert error is None, error
        assert result is not None
        answers[result.get_response().id] = result.as_numpy(output)
        if len(answers) == len(requests):
            done.set()

    client.start_stream(callback=on_answer)
    try:
        for request_id, inputs in requests.items():
            client.async_stream_infer(model, inputs, request_id=request_id)
        assert done.wait(30)
    finally:
        client.stop_stream()
    return answers


def test_a_grpc_stream_is_answered_through_a_worker(workers_server: ServerProcess) -> None:
    """ModelStreamInfer: each request decoded in the worker, answered in order of arrival
    by id, with the model's outputs."""
    images = _images(6, seed=5)
    expected = _reference(images)["probabilities"]
    sent = {}
    for index in range(len(images)):
        tensor = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
        tensor.set_data_from_numpy(images[index : index + 1])
        sent[str(index)] = [tensor]
    client = grpcclient.InferenceServerClient(workers_server.grpc_url)
    answers = _streamed(client, "digits_cnn", sent, "probabilities")
    for index in range(len(images)):
        np.testing.assert_allclose(answers[str(index)][0], expected[index], rtol=1e-5, atol=1e-6)


def test_a_raw_binary_http_request_is_decoded_by_a_worker(workers_server: ServerProcess) -> None:
    """Triton's raw binary request (the body is the model's one input) needs the model's
    configuration, which the worker holds once it has seen the model."""
    image = _images(1, seed=6)
    url = f"http://{workers_server.http_url}/v2/models/digits_cnn/infer"
    headers = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    for _ in range(6):  # both workers, before and after each knows the model
        response = httpx.post(url, content=image.tobytes(), headers=headers)
        assert response.status_code == 200, response.text
        length = int(response.headers["inference-header-content-length"])
        probabilities = np.frombuffer(response.content[length:][40:], dtype=np.float32)
        np.testing.assert_allclose(probabilities, _reference(image)["probabilities"][0], rtol=1e-5)


def test_concurrent_requests_each_get_their_own_answer(workers_server: ServerProcess) -> None:
    """Requests a worker decodes in the same pass travel to the model as one group and are
    split again: each of many concurrent callers, with its own images and batch size, must
    get back exactly its own rows, over both protocols."""
    count = 48
    images = [_images(1 + index % 3, seed=100 + index) for index in range(count)]
    expected = [_reference(batch)["logits"] for batch in images]
    before = _stats_success(workers_server)
    requests_before = metric(workers_server, "batchserve_worker_requests_total")
    handoffs_before = metric(workers_server, "batchserve_worker_handoffs_total")

    async def burst() -> list[np.ndarray]:
        """Every request at once, each on its own connection: many reach a worker together."""
        url = f"http://{workers_server.http_url}/v2/models/digits_cnn/infer"
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:

            async def one(batch: np.ndarray) -> np.ndarray:
                body = {"inputs": [{"name": "image", "datatype": "FP32",
                                    "shape": list(batch.shape), "data": batch.ravel().tolist()}],
                        "outputs": [{"name": "logits"}]}  # fmt: skip
                answer = (await client.post(url, json=body)).json()["outputs"][0]
                return np.array(answer["data"], dtype=np.float32).reshape(answer["shape"])

            return list(await asyncio.gather(*(one(batch) for batch in images)))

    def over_grpc(index: int) -> np.ndarray:
        client = grpcclient.InferenceServerClient(workers_server.grpc_url)
        tensor = grpcclient.InferInput("image", list(images[index].shape), "FP32")
        tensor.set_data_from_numpy(images[index])
        return client.infer("digits_cnn", [tensor]).as_numpy("logits")

    for _ in range(3):
        for index, answer in enumerate(asyncio.run(burst())):
            np.testing.assert_allclose(answer, expected[index], rtol=1e-5, atol=1e-5)
        with ThreadPoolExecutor(16) as pool:
            for index, answer in enumerate(pool.map(over_grpc, range(count))):
                np.testing.assert_allclose(answer, expected[index], rtol=1e-5, atol=1e-5)
    assert _stats_success(workers_server) - before == 6 * count
    requests = metric(workers_server, "batchserve_worker_requests_total") - requests_before
    handoffs = metric(workers_server, "batchserve_worker_handoffs_total") - handoffs_before
    assert requests > 5 * count  # a worker's first request to a model goes whole, not handed
    assert handoffs < requests, "requests that reach a worker together travel as one group"


def test_a_large_grpc_request_is_answered_through_a_worker_unary_and_on_a_stream(
    workers_server: ServerProcess,
) -> None:
    """A message of head.VIEW_FROM bytes or more has its raw contents viewed in the worker's
    copy of the message (two of them here: tokens and lengths), not parsed by protobuf;
    tritonclient's answers match the model run in-process, by request and by id."""
    rng = np.random.default_rng(9)
    tokens = rng.integers(3, VOCAB_SIZE, (16, 300)).astype(np.int64)
    lengths = rng.integers(200, 301, (16, 1)).astype(np.int64)
    # over head.VIEW_FROM (32 KiB), not imported: its protos clash with tritonclient's here
    assert tokens.nbytes + lengths.nbytes >= 32 * 1024
    session = ort.InferenceSession(str(MODEL_REPO / "char_lstm" / "1" / "model.onnx"))
    (expected,) = session.run(["next_char_logits"], {"tokens": tokens, "lengths": lengths})

    def inputs() -> list[grpcclient.InferInput]:
        sent = []
        for name, array in (("tokens", tokens), ("lengths", lengths)):
            tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            sent.append(tensor)
        return sent

    client = grpcclient.InferenceServerClient(workers_server.grpc_url)
    for _ in range(4):  # both workers, before and after each knows the layout
        result = client.infer("char_lstm", inputs())
        np.testing.assert_allclose(
            result.as_numpy("next_char_logits"), expected, rtol=1e-4, atol=1e-5
        )
    sent = {f"large-{index}": inputs() for index in range(3)}
    answers = _streamed(client, "char_lstm", sent, "next_char_logits")
    for index in range(3):
        np.testing.assert_allclose(answers[f"large-{index}"], expected, rtol=1e-4, atol=1e-5)
