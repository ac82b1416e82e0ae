"""Triton's queue policies through to the model, as its L0_model_queue checks them:
``timeout_action: DELAY`` (``test_policy_delay``: a request past its queue timeout is not
refused but waits behind later requests still within theirs, which batch without it; it is
then answered once its queue delay is out), and an ensemble's request reaching its steps
with the priority it named (``test_priority_with_policy``'s ensemble trials). Over HTTP and
gRPC, by one process and by two request-handling workers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.ensemble_models import ROW, write_composing_models, write_ensemble
from tests.integration.server import metric, start_server
from tests.integration.slow_model import write_slow_model
from tests.integration.test_faults import wait_until
from tests.integration.test_queue_limits import BLOCK_ITERATIONS, ENSEMBLE, ask

QUEUE_DELAY_S = 2.0
CONFIG = f"""
name: "doubler"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: {int(QUEUE_DELAY_S * 1e6)}
  default_queue_policy {{ timeout_action: DELAY default_timeout_microseconds: 100000 }}
}}
batchserve {{ wait_out_queue_delay: true }}
"""


Results = dict[str, tuple[float, object]]
"""Per request: the seconds it took, and its answer or error."""


def _infer(url: str, protocol: str, rows: int, results: Results, key: str) -> None:
    """Send ``rows`` rows of ``rows`` and keep the answer (or error) and the time it took."""
    client_module = httpclient if protocol == "http" else grpcclient
    client = client_module.InferenceServerClient(url)
    x = np.full((rows, ROW), float(rows), dtype=np.float32)
    tensor = client_module.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    started = time.monotonic()
    try:
        answer = client.infer("doubler", [tensor]).as_numpy("OUTPUT0")
        results[key] = (time.monotonic() - started, answer)
    except Exception as exc:  # kept for the assertion to show
        results[key] = (time.monotonic() - started, exc)
    finally:
        client.close()


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
def test_a_timed_out_request_is_delayed_not_refused(tmp_path: Path, workers: str) -> None:
    write_composing_models(tmp_path)
    (tmp_path / "doubler" / "config.pbtxt").write_text(CONFIG)
    server = start_server(tmp_path, ["--workers", workers])
    try:
        results: Results = {}
        urls = {"http": server.http_url, "grpc": server.grpc_url}
        plan = [("first", "http", 1), ("second", "grpc", 2), ("third", "http", 2)]
        threads = [
            threading.Thread(target=_infer, args=(urls[protocol], protocol, rows, results, key))
            for key, protocol, rows in plan
        ]
        threads[0].start()
        time.sleep(0.2)  # past the first request's 100 ms timeout: it is delayed
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join()
        for key, _, rows in plan:
            answer = results[key][1]
            assert isinstance(answer, np.ndarray), (key, answer)
            np.testing.assert_array_equal(answer, np.full((rows, ROW), 2.0 * rows))
        # the later two reach a preferred size (4) without the delayed one and go at once
        assert results["second"][0] < QUEUE_DELAY_S / 2
        assert results["third"][0] < QUEUE_DELAY_S / 2
        # the delayed one goes alone once its queue delay is out
        assert QUEUE_DELAY_S - 0.1 < results["first"][0] < QUEUE_DELAY_S + 1.5
        stats = httpclient.InferenceServerClient(server.http_url)
        try:
            batches = stats.get_inference_statistics("doubler")["model_stats"][0]["batch_stats"]
        finally:
            stats.close()
        assert sorted((b["batch_size"], b["compute_infer"]["count"]) for b in batches) == [
            (1, 1),
            (4, 1),
        ]
    finally:
        assert server.stop() == 0


LEVELS = """dynamic_batching {
  priority_levels: 2 default_priority_level: 1
  priority_queue_policy { key: 2 value: { default_timeout_microseconds: 300000 } }
}
"""


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
def test_an_ensemble_passes_its_requests_priority_to_its_steps(
    tmp_path: Path, workers: str
) -> None:
    """Triton lets any priority through an ensemble (it has no levels of its own) to its
    steps, where the composing model's levels and their policies apply: here level 2's
    300 ms timeout refuses the step while another request keeps the model busy. batchserve
    had mapped it onto the ensemble's one level, so the step waited at level 1."""
    write_slow_model(tmp_path, "slow", max_queue_size=8)
    config = tmp_path / "slow" / "config.pbtxt"
    kept = [line for line in config.read_text().splitlines() if "dynamic_batching" not in line]
    config.write_text("\n".join(kept) + "\n" + LEVELS)
    write_ensemble(tmp_path, ENSEMBLE.replace("max_batch_size: 8", "max_batch_size: 1"),
                   "through_ensemble")  # fmt: skip
    server = start_server(tmp_path, ["--workers", workers])
    try:
        busy = threading.Thread(target=ask, args=(server.http_url, BLOCK_ITERATIONS, "slow", 0))
        busy.start()
        # it runs: the ensemble's step queues behind it
        wait_until(lambda: metric(server, "batchserve_busy_instances", model="slow") == 1)
        started = time.monotonic()
        refused = ask(server.http_url, 1, "through_ensemble", 2)
        took = time.monotonic() - started
        busy.join()
        assert refused.startswith("in ensemble 'through_ensemble', Request timeout expired"), (
            refused
        )
        assert took < 2.0
        assert ask(server.http_url, 1, "through_ensemble", 1) == "ok"
    finally:
        assert server.stop() == 0
