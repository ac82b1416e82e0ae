"""Triton's identity backend served end to end: model repositories written for Triton (its
L0 tests, its perf_analyzer examples) answered by tritonclient over HTTP and gRPC and by
perf_analyzer, batched by the dynamic batcher, by one process and by two workers."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, metric, run_perf_analyzer, start_server

DELAY_MS = 40
MODELS = {
    "ident": f"""
backend: "identity"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "execute_delay_ms" value {{ string_value: "{DELAY_MS}" }} }}
""",
    "words": """
backend: "identity"
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
""",
    "stepped": """
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching { }
parameters { key: "execute_delay_ms" value { string_value: "1500" } }
""",
    "named.identity": None,  # no config: the backend comes from the name, as in Triton
    "counted": """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
""",
    "staggered": """
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters [
  { key: "execute_delay_ms" value { string_value: "100" } },
  { key: "instance_wise_delay_multiplier" value { string_value: "4" } }
]
""",
    "mismatched": """
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
}


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def identities(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("identity")
    for name, text in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        if text is not None:
            (repo / name / "config.pbtxt").write_text(text)
    # not ready as a whole while "mismatched" fails (Triton's strict readiness)
    args = ["--workers", request.param, "--exit-on-error", "false"]
    server = start_server(repo, args, wait_ready=False)
    server.wait_for("server not ready: a model failed to load")
    yield server
    assert server.stop() == 0


def _fp32(client: Any, rows: np.ndarray) -> Any:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    tensor = module.InferInput("INPUT0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_are_the_inputs_over_both_protocols(
    identities: ServerProcess, protocol: str
) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    words = np.array([b"one", b"", b"\x00\xff"], dtype=object)
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(identities.http_url)
        text = httpclient.InferInput("INPUT0", [3], "BYTES")
    else:
        client = grpcclient.InferenceServerClient(identities.grpc_url)
        text = grpcclient.InferInput("INPUT0", [3], "BYTES")
    text.set_data_from_numpy(words)
    with client:
        result = client.infer("ident", [_fp32(client, rows)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows)
        assert _parameters(result.get_response(), protocol) == EXAMPLE_PARAMETERS
        result = client.infer("words", [text])
        assert result.as_numpy("OUTPUT0").tolist() == words.tolist()
        assert _parameters(result.get_response(), protocol) == EXAMPLE_PARAMETERS


EXAMPLE_PARAMETERS = {
    "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123,
}  # fmt: skip
"""What Triton's identity backend attaches to every response (its L0_backend_identity reads
them back)."""


def _parameters(response: Any, protocol: str) -> dict[str, object]:
    if protocol == "http":
        return dict(response["parameters"])
    return {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in response.parameters.items()
    }


def test_its_own_metric_counts_the_input_bytes_per_model_version(
    identities: ServerProcess,
) -> None:
    """Triton's identity backend registers ``input_byte_size_counter`` and adds each
    request's input bytes; the series exists from the load on, at 0."""
    exposition = httpx.get(f"http://127.0.0.1:{identities.metrics_port}/metrics", timeout=10)
    assert 'input_byte_size_counter{model="counted",version="1"} 0\n' in exposition.text
    with httpclient.InferenceServerClient(identities.http_url) as client:
        for rows in (1, 3, 2):  # 8 bytes a row
            tensor = httpclient.InferInput("INPUT0", [rows, 2], "INT32")
            tensor.set_data_from_numpy(np.ones((rows, 2), np.int32))
            client.infer("counted", [tensor])
    counted = metric(identities, "input_byte_size_counter_total", model="counted", version="1")
    assert counted == 48  # the parser reads a bare counter as <name>_total


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(
    identities: ServerProcess,
) -> None:
    """While one execution sleeps ``execute_delay_ms``, the requests behind it form a batch:
    fewer executions than requests, and every answer still the request's own input."""
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(identities.grpc_url) as client:
        before = client.get_inference_statistics("ident", as_json=True)["model_stats"][0]
        for k in range(12):
            rows = np.full((1, 4), k, np.float32)
            client.async_infer(
                "ident", [_fp32(client, rows)],
                callback=lambda result, error, k=k: answers.put((k, result, error)),
            )  # fmt: skip
        for _ in range(12):
            k, result, error = answers.get(timeout=30)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), k))
        after = client.get_inference_statistics("ident", as_json=True)["model_stats"][0]
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == 12
    assert executions < 12


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_an_identity_model(identities: ServerProcess, protocol: str) -> None:
    url = identities.http_url if protocol == "http" else identities.grpc_url
    output = run_perf_analyzer("ident", protocol, url, "--concurrency-range", "4")
    assert "Throughput:" in output


def test_the_served_config_is_tritons(identities: ServerProcess) -> None:
    """As Triton's L0_model_config expects of an identity model on a host without GPUs."""
    with grpcclient.InferenceServerClient(identities.grpc_url) as client:
        named = client.get_model_config("named.identity", as_json=True)["config"]
        ident = client.get_model_config("ident", as_json=True)["config"]
    assert named["backend"] == "identity"
    assert named["default_model_filename"] == "model.identity"
    assert "input" not in named
    assert "platform" not in named
    assert named["instance_group"] == [{"name": "named.identity", "count": 1, "kind": "KIND_CPU"}]
    assert ident["parameters"]["execute_delay_ms"] == {"string_value": str(DELAY_MS)}


def test_a_config_tritons_identity_refuses_fails_its_load_in_its_words(
    identities: ServerProcess,
) -> None:
    with httpclient.InferenceServerClient(identities.http_url) as client:
        index = {m["name"]: m for m in client.get_model_repository_index()}
        with pytest.raises(InferenceServerException):
            client.infer("mismatched", [_fp32(client, np.zeros((1, 2), np.float32))])
    assert index["mismatched"]["state"] == "UNAVAILABLE"
    assert (
        "expected input and output datatype to match, got TYPE_INT32 and TYPE_FP32"
        in index["mismatched"]["reason"]
    )
    assert index["ident"]["state"] == "READY"


def test_steps_held_behind_their_sequence_count_as_pending(identities: ServerProcess) -> None:
    """Triton's nv_inference_pending_request_count counts the requests its sequence batcher
    holds (L0_metrics' queue-size cases): while a sequence's first step runs, its next two
    wait behind it. (The START goes first on its own: separate unary calls may arrive in
    any order.)"""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(identities.grpc_url) as client:
        for step in range(3):
            client.async_infer(
                "stepped", [_fp32(client, np.full((1, 4), step, np.float32))],
                sequence_id=7, sequence_start=step == 0,
                callback=lambda result, error: answers.put((result, error)),
            )  # fmt: skip
            time.sleep(0.3 if step == 0 else 0)  # the first step runs for 1.5 s
        time.sleep(0.3)
        assert metric(identities, "nv_inference_pending_request_count", model="stepped") == 2
        for _ in range(3):
            _, error = answers.get(timeout=30)
            assert error is None, error
    assert metric(identities, "nv_inference_pending_request_count", model="stepped") == 0


def test_cancelling_a_held_step_cancels_its_sequence(identities: ServerProcess) -> None:
    """As Triton's sequence batcher (L0_request_cancellation's scheduler cases): a client
    that cancels a step held behind its sequence's running step cancels the whole sequence,
    so the sequence's other held step is answered CANCELLED at once, and both count as
    CANCELED failures."""
    before = metric(
        identities, "nv_inference_request_failure_total", model="stepped", reason="CANCELED"
    )
    answers: list[queue.Queue[tuple[Any, Any]]] = [queue.Queue() for _ in range(3)]
    with grpcclient.InferenceServerClient(identities.grpc_url) as client:
        held = []
        for step in range(3):
            held.append(
                client.async_infer(
                    "stepped",
                    [_fp32(client, np.full((1, 4), step, np.float32))],
                    sequence_id=8,
                    sequence_start=step == 0,
                    callback=lambda result, error, step=step: answers[step].put((result, error)),
                )
            )
            time.sleep(0.3 if step == 0 else 0)  # the first step runs for 1.5 s
        time.sleep(0.3)
        held[1].cancel()
        result, error = answers[2].get(timeout=1.0)  # well before the running step ends
        assert result is None
        assert error.status() == "StatusCode.CANCELLED"
        first, error = answers[0].get(timeout=30)
        assert error is None, error
        np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), np.zeros((1, 4)))
        # the sequence has ended: a step without START is refused
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            client.infer("stepped", [_fp32(client, np.ones((1, 4), np.float32))], sequence_id=8)
    after = metric(
        identities, "nv_inference_request_failure_total", model="stepped", reason="CANCELED"
    )
    assert after - before == 2


def test_instance_wise_delay_multiplier_makes_one_instance_slower_as_tritons_does(
    identities: ServerProcess,
) -> None:
    """Two instances, 100 ms and the multiplier 4: instance 0 waits 100 ms (at least one
    delay), instance 1 waits 400 ms, so of two requests at once one is answered well before
    the other (L0_batcher's preserve-ordering model)."""

    def timed(value: float) -> float:
        client = httpclient.InferenceServerClient(identities.http_url)
        try:
            started = time.perf_counter()
            result = client.infer("staggered", [_fp32(client, np.full((4,), value, np.float32))])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((4,), value))
            return time.perf_counter() - started
        finally:
            client.close()

    with ThreadPoolExecutor(2) as pool:
        fast, slow = sorted(pool.map(timed, (1.0, 2.0)))
    assert 0.1 <= fast < 0.35, (fast, slow)
    assert slow >= 0.4, (fast, slow)
