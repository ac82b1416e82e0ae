"""Ensembles (``platform: "ensemble"``), served as Triton serves them: a real server, real
tritonclient over HTTP and gRPC, by one process and by two request-handling workers.

The ensemble (``tests/ensemble_models.py``) runs three ONNX models: ``doubler`` then
``adder`` (which reads the doubler's output), and ``negater`` beside them. Its requests are
the composing models' requests too, so they batch there and are counted there.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import (
    ENSEMBLE,
    ENSEMBLE_CONFIG,
    OPTIONAL,
    OPTIONAL_CONFIG,
    RESHAPED,
    RESHAPED_CONFIG,
    ROW,
    UNBATCHED,
    UNBATCHED_CONFIG,
    write_composing_models,
    write_ensemble,
    write_pipeline_repository,
    write_shifter,
)
from tests.integration.server import CONTROL_TOKEN, ServerProcess, metric, start_server
from tests.integration.slow_model import expected, write_slow_model
from tests.integration.test_faults import wait_until

HANDLING = {"one process": "1", "two workers": "2"}
LIMITED = "pipeline_limited"
"""The doubler as an ensemble of one step, with Triton's ``max_inflight_requests: 1``."""
HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}


@pytest.fixture(scope="module", params=list(HANDLING))
def served(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = write_pipeline_repository(tmp_path_factory.mktemp("ensemble_repo"))
    labels = repo / ENSEMBLE / "out_labels.txt"
    labels.write_text("".join(f"class{i}\n" for i in range(ROW)))
    config = repo / ENSEMBLE / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            'name: "OUT" data_type: TYPE_FP32 dims: [ 4 ]',
            'name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "out_labels.txt"',
        )
    )
    negater = repo / "negater" / "config.pbtxt"  # labels the ensemble's NEG inherits
    negater.write_text(
        negater.read_text().replace(
            'name: "Y" data_type: TYPE_FP32 dims: [ 4 ]',
            'name: "Y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "y_labels.txt"',
        )
    )
    (repo / "negater" / "y_labels.txt").write_text("".join(f"neg{i}\n" for i in range(ROW)))
    write_ensemble(repo, UNBATCHED_CONFIG, UNBATCHED)
    write_ensemble(repo, RESHAPED_CONFIG, RESHAPED)
    write_shifter(repo)
    write_ensemble(repo, OPTIONAL_CONFIG, OPTIONAL)
    limited = UNBATCHED_CONFIG.replace(UNBATCHED, LIMITED).replace(
        "max_batch_size: 0", "max_batch_size: 8"
    )
    write_ensemble(repo, limited.replace("step [", "max_inflight_requests: 1\n  step ["), LIMITED)
    # Triton's waiting, so that concurrent requests surely meet in the composing models'
    # queues however slowly a loaded machine lets the clients send them
    flags = ["--workers", HANDLING[request.param], "--wait-out-queue-delay", "true"]
    server = start_server(repo, flags)
    yield server
    assert server.stop() == 0


_OPEN: list[Any] = []
"""Clients the test's own thread made, closed when it ends: tritonclient's HTTP client
collected later, in another test, fails that test with an unraisable error."""


def _client(url: str, protocol: Any = httpclient) -> Any:
    """tritonclient's HTTP or gRPC client (``protocol``) at ``url``, closed after the test."""
    client = protocol.InferenceServerClient(url)
    _OPEN.append(client)
    return client


def _url(served: ServerProcess, protocol: Any) -> str:
    return served.http_url if protocol is httpclient else served.grpc_url


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _rows(first: float, count: int = 2) -> np.ndarray:
    return (first + np.arange(count * ROW, dtype=np.float32)).reshape(count, ROW)


def _statistics(server: ServerProcess, model: str) -> dict[str, int]:
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics(model)["model_stats"][0]
    client.close()
    return {
        "success": stats["inference_stats"]["success"]["count"],
        "fail": stats["inference_stats"]["fail"]["count"],
        "executions": stats["execution_count"],
        "inferences": stats["inference_count"],
    }


def test_an_ensemble_answers_with_its_steps_outputs_over_both_protocols(
    served: ServerProcess,
) -> None:
    http = _client(served.http_url)
    rows = _rows(1.0)
    given = httpclient.InferInput("IN", list(rows.shape), "FP32")
    given.set_data_from_numpy(rows)
    answer = http.infer(ENSEMBLE, [given])
    assert np.array_equal(answer.as_numpy("OUT"), 3 * rows)
    assert np.array_equal(answer.as_numpy("NEG"), -rows)
    assert answer.get_response()["model_name"] == ENSEMBLE
    grpc = _client(served.grpc_url, grpcclient)
    given_grpc = grpcclient.InferInput("IN", list(rows.shape), "FP32")
    given_grpc.set_data_from_numpy(rows)
    only_neg = [grpcclient.InferRequestedOutput("NEG")]
    answer_grpc = grpc.infer(ENSEMBLE, [given_grpc], outputs=only_neg)
    assert np.array_equal(answer_grpc.as_numpy("NEG"), -rows)
    assert answer_grpc.as_numpy("OUT") is None  # only what was asked for
    metadata = grpc.get_model_metadata(ENSEMBLE)
    assert metadata.platform == "ensemble"
    assert [(t.name, list(t.shape)) for t in metadata.inputs] == [("IN", [-1, ROW])]
    config = grpc.get_model_config(ENSEMBLE).config
    assert [step.model_name for step in config.ensemble_scheduling.step] == [
        "doubler", "adder", "negater",
    ]  # fmt: skip
    # Triton's ensemble says whether it is decoupled even when not: L0_model_config expects it
    assert config.HasField("model_transaction_policy")
    assert not config.model_transaction_policy.decoupled
    assert http.get_model_config(ENSEMBLE)["model_transaction_policy"] == {"decoupled": False}


def test_concurrent_ensemble_requests_batch_in_the_composing_models(
    served: ServerProcess,
) -> None:
    before = {m: _statistics(served, m) for m in (ENSEMBLE, "doubler", "adder", "negater")}

    def ask(index: int) -> bool:
        client = httpclient.InferenceServerClient(served.http_url)
        rows = _rows(float(index), 1)
        given = httpclient.InferInput("IN", [1, ROW], "FP32")
        given.set_data_from_numpy(rows)
        answer = client.infer(ENSEMBLE, [given])
        client.close()
        return bool(np.array_equal(answer.as_numpy("OUT"), 3 * rows)) and bool(
            np.array_equal(answer.as_numpy("NEG"), -rows)
        )

    requests = 48
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(ask, range(requests)))
    after = {m: _statistics(served, m) for m in before}
    grew = {m: {k: after[m][k] - before[m][k] for k in after[m]} for m in after}
    assert grew[ENSEMBLE]["success"] == requests
    assert grew[ENSEMBLE]["inferences"] == requests
    assert grew[ENSEMBLE]["executions"] == requests  # Triton: one per ensemble request
    for model in ("doubler", "adder", "negater"):
        assert grew[model]["success"] == requests, (model, grew)
        assert grew[model]["inferences"] == requests, (model, grew)
        assert grew[model]["executions"] < requests, (model, grew)  # batched there


@pytest.mark.parametrize("protocol", [httpclient, grpcclient], ids=["http", "grpc"])
def test_shapes_follow_tritons_rules_across_batching_and_reshape(
    served: ServerProcess, protocol: Any
) -> None:
    client = _client(_url(served, protocol), protocol)
    row = _rows(2.0, 1)[0]
    given = protocol.InferInput("IN", [ROW], "FP32")  # no batch axis: the model does not batch
    given.set_data_from_numpy(row)
    answer = client.infer(UNBATCHED, [given]).as_numpy("OUT")
    assert answer.shape == (ROW,)
    assert np.array_equal(answer, 2 * row)
    squares = _rows(1.0, 3).reshape(3, 2, 2)
    given = protocol.InferInput("IN", [3, 2, 2], "FP32")
    given.set_data_from_numpy(squares)
    answer = client.infer(RESHAPED, [given]).as_numpy("OUT")
    assert answer.shape == (3, 2, 2)  # the ensemble's dims, its steps saw [3, 4]
    assert np.array_equal(answer, 2 * squares)


def test_max_inflight_requests_holds_a_step_to_that_many_at_once(served: ServerProcess) -> None:
    """With one request in flight at its step, the doubler never sees two at once from the
    limited ensemble, so nothing batches there."""
    before = _statistics(served, "doubler")

    def ask(index: int) -> bool:
        client = httpclient.InferenceServerClient(served.http_url)
        rows = _rows(float(index), 1)
        given = httpclient.InferInput("IN", [1, ROW], "FP32")
        given.set_data_from_numpy(rows)
        answer = client.infer(LIMITED, [given]).as_numpy("OUT")
        client.close()
        return bool(np.array_equal(answer, 2 * rows))

    with ThreadPoolExecutor(12) as pool:
        assert all(pool.map(ask, range(24)))
    after = _statistics(served, "doubler")
    assert after["success"] - before["success"] == 24
    assert after["executions"] - before["executions"] == 24
    served.drain_logs()
    said = f"Ensemble model '{LIMITED}' configured with max_inflight_requests: 1"
    assert any(record.get("message") == said for record in served.logs)


def test_steps_writing_nothing_asked_for_do_not_run(served: ServerProcess) -> None:
    """Triton prunes them: asking for NEG alone runs the negater, not the doubler and adder."""
    before = {m: _statistics(served, m)["success"] for m in ("doubler", "adder", "negater")}
    grpc = _client(served.grpc_url, grpcclient)
    rows = _rows(3.0)
    given = grpcclient.InferInput("IN", list(rows.shape), "FP32")
    given.set_data_from_numpy(rows)
    answer = grpc.infer(ENSEMBLE, [given], outputs=[grpcclient.InferRequestedOutput("NEG")])
    assert np.array_equal(answer.as_numpy("NEG"), -rows)
    after = {m: _statistics(served, m)["success"] for m in before}
    assert {m: after[m] - before[m] for m in before} == {"doubler": 0, "adder": 0, "negater": 1}


@pytest.mark.parametrize("protocol", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_optional_input_left_out_reaches_its_step_as_nothing(
    served: ServerProcess, protocol: Any
) -> None:
    client = _client(_url(served, protocol), protocol)
    rows = _rows(1.0)
    given = protocol.InferInput("IN", list(rows.shape), "FP32")
    given.set_data_from_numpy(rows)
    assert np.array_equal(client.infer(OPTIONAL, [given]).as_numpy("OUT"), rows)
    shift = protocol.InferInput("SHIFT", list(rows.shape), "FP32")
    shift.set_data_from_numpy(np.full(rows.shape, 10.0, dtype=np.float32))
    assert np.array_equal(client.infer(OPTIONAL, [given, shift]).as_numpy("OUT"), rows + 10)


def test_a_request_the_ensemble_refuses_names_it_and_a_fresh_one_is_answered(
    served: ServerProcess,
) -> None:
    http = _client(served.http_url)
    wrong = httpclient.InferInput("IN", [1, ROW + 1], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, ROW + 1), dtype=np.float32))
    with pytest.raises(InferenceServerException) as refused:
        http.infer(ENSEMBLE, [wrong])
    assert refused.value.status() == "400"
    assert refused.value.message().startswith(
        f"unexpected shape for input 'IN' for model '{ENSEMBLE}'. Expected [-1,{ROW}], got "
        f"[1,{ROW + 1}]"
    )
    rows = _rows(5.0, 1)
    given = httpclient.InferInput("IN", [1, ROW], "FP32")
    given.set_data_from_numpy(rows)
    assert np.array_equal(http.infer(ENSEMBLE, [given]).as_numpy("OUT"), 3 * rows)


def test_classification_of_an_ensemble_output_uses_its_labels(served: ServerProcess) -> None:
    """Triton's label_override ensembles: the ensemble's own output labels; an output
    without its own takes those of the composing model's output that writes it."""
    http = _client(served.http_url)
    rows = np.array([[1.0, 4.0, 2.0, 3.0]], dtype=np.float32)
    given = httpclient.InferInput("IN", [1, ROW], "FP32")
    given.set_data_from_numpy(rows)
    top = [httpclient.InferRequestedOutput(name, class_count=2) for name in ("OUT", "NEG")]
    answer = http.infer(ENSEMBLE, [given], outputs=top)
    out = [b.decode() for b in answer.as_numpy("OUT")[0]]
    assert out == ["12.000000:1:class1", "9.000000:3:class3"]
    neg = [b.decode() for b in answer.as_numpy("NEG")[0]]
    assert neg == ["-1.000000:0:neg0", "-2.000000:2:neg2"]


def _explicit(repo: Path, workers: str, *load: str) -> ServerProcess:
    args = ["--model-control-mode", "explicit", "--workers", workers]
    for name in load:
        args += ["--load-model", name]
    return start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})


def _states(server: ServerProcess) -> dict[str, tuple[str, str]]:
    client = httpclient.InferenceServerClient(server.http_url)
    rows = client.get_model_repository_index(headers=HEADERS)
    client.close()
    return {row["name"]: (row.get("state", ""), row.get("reason", "")) for row in rows}


@pytest.mark.parametrize("workers", list(HANDLING.values()), ids=list(HANDLING))
def test_loading_an_ensemble_loads_its_models_and_unloading_follows_tritons_rules(
    tmp_path: Path, workers: str
) -> None:
    repo = write_pipeline_repository(tmp_path)
    server = _explicit(repo, workers, ENSEMBLE)
    try:
        states = _states(server)
        assert {m: states[m][0] for m in states} == dict.fromkeys(
            (ENSEMBLE, "doubler", "adder", "negater"), "READY"
        )
        http = _client(server.http_url)
        # unloading a composing model unloads the ensemble as Triton does (its error logged,
        # its state "unloaded"): a strictly ready server stays ready (L0_lifecycle)
        http.unload_model("adder", headers=HEADERS)
        states = _states(server)
        assert states["adder"][0] == "UNAVAILABLE"
        assert states[ENSEMBLE] == ("UNAVAILABLE", "unloaded")
        assert states["doubler"][0] == "READY"
        assert http.is_server_ready(headers=HEADERS)
        server.wait_for(
            f"Invalid argument: ensemble '{ENSEMBLE}' depends on 'adder' which has no loaded "
            "version."
        )
        # adder loaded by name, then the ensemble again: unload_dependents then takes the
        # composing models loaded along with it, but not the one loaded by name
        http.load_model("adder", headers=HEADERS)
        assert _states(server)[ENSEMBLE][0] == "UNAVAILABLE"  # not reloaded by itself
        http.load_model(ENSEMBLE, headers=HEADERS)
        assert {m: s for m, (s, _) in _states(server).items()} == dict.fromkeys(
            (ENSEMBLE, "doubler", "adder", "negater"), "READY"
        )
        http.unload_model(ENSEMBLE, headers=HEADERS, unload_dependents=True)
        states = _states(server)
        assert states[ENSEMBLE][0] == "UNAVAILABLE"
        assert states["doubler"][0] == "UNAVAILABLE"
        assert states["negater"][0] == "UNAVAILABLE"
        assert states["adder"][0] == "READY"  # loaded by name: not the ensemble's to unload
    finally:
        assert server.stop() == 0


def test_an_ensemble_whose_model_cannot_load_is_unavailable_with_the_reason(
    tmp_path: Path,
) -> None:
    repo = write_pipeline_repository(tmp_path)
    (repo / "negater" / "config.pbtxt").write_text("max_batch_size: -1")
    broken = ENSEMBLE_CONFIG.replace('"doubler"', '"doubler" model_version: 1', 1)
    write_ensemble(repo, broken.replace("model_version: 1\n      model_version: -1", ""))
    server = start_server(repo, ["--workers", "1"], wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        states = _states(server)
        state, reason = states[ENSEMBLE]
        assert state == "UNAVAILABLE"
        assert reason.startswith(
            f"ensemble '{ENSEMBLE}' depends on 'negater' which has no loaded version. Model "
            "'negater' loading failed with error: "
        ), reason
        assert "'max_batch_size' must be non-negative value for negater" in reason
        assert states["doubler"][0] == "READY"
        http = _client(server.http_url)
        given = httpclient.InferInput("IN", [1, ROW], "FP32")
        given.set_data_from_numpy(_rows(0.0, 1))
        with pytest.raises(InferenceServerException) as refused:
            http.infer(ENSEMBLE, [given])
        assert refused.value.status() == "503"
    finally:
        assert server.stop() == 0


def test_ensembles_that_lead_back_to_themselves_are_refused(tmp_path: Path) -> None:
    repo = write_pipeline_repository(tmp_path)
    loop = ENSEMBLE_CONFIG.replace('model_name: "negater"', f'model_name: "{ENSEMBLE}"', 1)
    loop = loop.replace('key: "X" value: "IN"', 'key: "IN" value: "IN"')
    loop = loop.replace('key: "Y" value: "NEG"', 'key: "NEG" value: "NEG"')
    write_ensemble(repo, loop)
    server = start_server(repo, ["--workers", "1"], wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        state, reason = _states(server)[ENSEMBLE]
        assert state == "UNAVAILABLE"
        assert (
            f"circular dependency between ensembles: {ENSEMBLE} -> ... -> {ENSEMBLE} -> "
            f"{ENSEMBLE} (batchserve: {ENSEMBLE} -> {ENSEMBLE})"
        ) in reason
    finally:
        assert server.stop() == 0


def test_a_step_that_fails_fails_the_request_in_tritons_words(tmp_path: Path) -> None:
    """A composing model whose queue holds one request (and whose batches wait out their
    delay, so that it fills) refuses a step, and the client reads which ensemble it was."""
    repo = write_pipeline_repository(tmp_path, delay_us=2_000_000)
    config = repo / "negater" / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            "max_queue_delay_microseconds: 2000000",
            "max_queue_delay_microseconds: 2000000 default_queue_policy { max_queue_size: 1 }",
        )
    )
    server = start_server(repo, ["--workers", "1", "--wait-out-queue-delay", "true"])
    try:

        def ask(index: int) -> str:
            client = httpclient.InferenceServerClient(server.http_url)
            given = httpclient.InferInput("IN", [1, ROW], "FP32")
            given.set_data_from_numpy(_rows(float(index), 1))
            try:
                client.infer(ENSEMBLE, [given])
                return "ok"
            except InferenceServerException as exc:
                return f"{exc.status()} {exc.message()}"
            finally:
                client.close()

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(ask, range(6)))
        refused = [a for a in answers if a != "ok"]
        assert refused, answers
        for answer in refused:
            assert answer.startswith(f"503 in ensemble '{ENSEMBLE}', "), answer
        assert "ok" in answers
        failed = "nv_inference_request_failure_total"  # Triton: an ensemble's are OTHER,
        # each counted twice (answered with the error, then let go), as Triton's do
        assert metric(server, failed, model=ENSEMBLE, reason="OTHER") == 2 * len(refused)
        assert metric(server, failed, model=ENSEMBLE, reason="REJECTED") == 0
        assert metric(server, failed, model="negater", reason="REJECTED") == len(refused)
    finally:
        assert server.stop() == 0


SLOW_PIPELINE = """
name: "slow_pipeline"
platform: "ensemble"
max_batch_size: 1
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "iterations" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "slow"
      input_map { key: "x" value: "x" }
      input_map { key: "iterations" value: "iterations" }
      output_map { key: "y" value: "shifted" }
    },
    {
      model_name: "doubler"
      input_map { key: "INPUT0" value: "shifted" }
      output_map { key: "OUTPUT0" value: "OUT" }
    }
  ]
}
"""


@pytest.mark.parametrize("workers", list(HANDLING.values()), ids=list(HANDLING))
def test_sigterm_answers_every_accepted_ensemble_request(tmp_path: Path, workers: str) -> None:
    """Requests still in an ensemble's first step when the server is told to stop are
    answered whole, though its second step's model was loaded first (by name) and would be
    unloaded first: the drain answers what was accepted before any model unloads, and the
    server exits 0."""
    write_composing_models(tmp_path)
    write_slow_model(tmp_path, "slow", max_queue_size=16, max_batch_size=1)
    write_ensemble(tmp_path, SLOW_PIPELINE, "slow_pipeline")
    server = start_server(tmp_path, ["--workers", workers])

    def ask(index: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("x", [1, ROW], "FP32")
        x.set_data_from_numpy(np.full((1, ROW), float(index), dtype=np.float32))
        count = httpclient.InferInput("iterations", [1, 1], "INT64")
        count.set_data_from_numpy(np.array([[1000]], dtype=np.int64))
        answer = client.infer("slow_pipeline", [x, count]).as_numpy("OUT")
        client.close()
        return np.asarray(answer)

    try:
        with ThreadPoolExecutor(4) as pool:
            asked = [pool.submit(ask, index) for index in range(4)]
            # the first runs its slow step; the others queue there
            wait_until(lambda: metric(server, "batchserve_queue_depth", model="slow") == 3)
            server.process.send_signal(signal.SIGTERM)
            answers = [one.result(timeout=60) for one in asked]
    finally:
        code = server.stop(clients_may_linger=True)  # their connections waited for answers
    for index, answer in enumerate(answers):
        x = np.full((1, ROW), float(index), dtype=np.float32)
        assert np.allclose(answer, 2 * expected(x)), (index, answer)
    assert code == 0


def test_a_model_the_start_up_names_stays_when_its_ensemble_goes(tmp_path: Path) -> None:
    """An ensemble loaded first (by name order) loads its composing models; one the start-up
    also names is the user's, so ``unload_dependents`` leaves it, as Triton leaves every
    model a start-up loads."""
    write_composing_models(tmp_path)
    first = "a_pipeline"  # sorts before its composing models
    write_ensemble(tmp_path, ENSEMBLE_CONFIG.replace(f'"{ENSEMBLE}"', f'"{first}"'), first)
    server = _explicit(tmp_path, "1", first, "negater")
    try:
        server.drain_logs()
        loads = [r.get("model") for r in server.logs if r.get("message") == "model ready"]
        assert loads.count("negater") == 1  # loaded for the ensemble, not again by name
        http = _client(server.http_url)
        http.unload_model(first, headers=HEADERS, unload_dependents=True)
        states = {m: s for m, (s, _) in _states(server).items()}
        assert states == {
            first: "UNAVAILABLE", "doubler": "UNAVAILABLE", "adder": "UNAVAILABLE",
            "negater": "READY",
        }  # fmt: skip
    finally:
        assert server.stop() == 0


def test_two_ensembles_that_use_each_other_are_refused_not_waited_on(tmp_path: Path) -> None:
    """loop_a runs loop_b, which runs loop_a: each load stops at the circle, naming the
    chain, and the server starts (not ready) instead of waiting for ever."""
    write_composing_models(tmp_path)
    for name, other in (("loop_a", "loop_b"), ("loop_b", "loop_a")):
        write_ensemble(
            tmp_path,
            f'name: "{name}" platform: "ensemble" max_batch_size: 8 '
            f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ROW} ] }} ] '
            f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ROW} ] }} ] '
            f'ensemble_scheduling {{ step [ {{ model_name: "{other}" '
            'input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }',
            name,
        )
    server = start_server(tmp_path, ["--workers", "1"], wait_ready=False)
    try:
        server.wait_for("server not ready: a model failed to load")
        states = _states(server)
        assert states["loop_a"][0] == states["loop_b"][0] == "UNAVAILABLE"
        for name in ("loop_a", "loop_b"):  # the chain as the last load to try it met it
            reason = states[name][1]
            assert re.search(
                r"circular dependency between ensembles: (loop_a|loop_b) -> \.\.\. -> "
                r"(?!\1)(loop_a|loop_b) -> \1 \(batchserve: \1 -> \2 -> \1\)",
                reason,
            ), reason
        assert states["doubler"][0] == "READY"
    finally:
        assert server.stop() == 0
