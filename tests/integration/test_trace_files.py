"""Triton's ``triton`` trace mode end to end: a real server writes JSON trace files, driven
by tritonclient over HTTP and gRPC and by Triton's trace settings API, and read back here
as Triton's ``trace_summary.py`` reads them: records grouped by ``id``, one naming the
model, one per timestamp, one per tensor at level TENSORS, an ensemble's steps as traces
whose ``parent_id`` is the ensemble's.

The files are written where Triton writes them: ``<file>`` at the stop (or when its setting
is set again), ``<file>.N`` every ``log_frequency`` traces or once a count runs out.
"""

from __future__ import annotations

import csv
import json
import queue
import shutil
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import (
    ENSEMBLE,
    NESTED,
    NESTED_CONFIG,
    PICKING,
    ROW,
    write_ensemble,
    write_picking,
    write_pipeline_repository,
)
from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server
from tests.integration.test_ensemble_decoupled import stream_inputs
from tests.integration.test_ensemble_decoupled import write_repository as write_decoupled
from tests.integration.test_faults import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}
HTTP_ORDER = (
    "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE",
    "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END",
)  # fmt: skip
"""A request's timestamps over HTTP in the order they must happen (``trace_summary.py``
refuses a span whose end precedes its start)."""
GRPC_ORDER = (
    "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_ORDER[2:10], "GRPC_SEND_START",
    "GRPC_SEND_END",
)  # fmt: skip

Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


def _repository(root: Path) -> Path:
    repo = write_pipeline_repository(root, delay_us=0)
    write_ensemble(repo, NESTED_CONFIG, NESTED)
    return repo


def _server(
    root: Path, *trace: str, workers: str = "1", extra: Callable[[Path], None] | None = None
) -> ServerProcess:
    """A server of the pipeline and nested ensembles (and what ``extra`` writes beside)."""
    args = [arg for entry in trace for arg in ("--trace-config", entry)]
    env = {"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN, "BATCHSERVE_WORKERS": workers}
    repo = _repository(root / "repo")
    if extra is not None:
        extra(repo)
    return start_server(repo, args, extra_env=env)


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _client(server: ServerProcess, protocol: str) -> Client:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(client: Client, model: str, x: np.ndarray, request_id: str) -> Any:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    name = {NESTED: "X", ENSEMBLE: "IN", "negater": "X"}.get(model, "INPUT0")
    tensor = module.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], request_id=request_id)


def _traces(path: Path) -> dict[int, list[dict[str, Any]]]:
    """The file's records by trace id, as ``trace_summary.py`` groups them."""
    records = json.loads(path.read_text())
    assert isinstance(records, list)
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record["id"]].append(record)
    return dict(grouped)


def _head(records: list[dict[str, Any]]) -> dict[str, Any]:
    (head,) = [r for r in records if "model_name" in r]
    return head


def _stamps(records: list[dict[str, Any]]) -> dict[str, int]:
    stamps: dict[str, int] = {}
    for record in records:
        for stamp in record.get("timestamps", ()):
            assert stamp["name"] not in stamps, f"{stamp['name']} twice"
            stamps[stamp["name"]] = stamp["ns"]
    return stamps


def test_each_request_is_a_trace_with_triton_s_timestamps_in_order(
    tmp_path: Path, protocol: str
) -> None:
    """Three requests to the doubler at rate 1: the file appears at the stop, as Triton
    writes it with no log frequency, and holds three traces numbered 1-3, each naming its
    model and request id, with every timestamp Triton writes, in order."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "rate=1")
    client = _client(server, protocol)
    try:
        x = np.arange(ROW, dtype=np.float32).reshape(1, ROW)
        for n in range(3):
            answer = _infer(client, "doubler", x + n, f"r{n}")
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), 2 * (x + n))
        assert not trace.exists()  # written when its setting ends: here, the stop
    finally:
        client.close()
        assert server.stop() == 0
    traces = _traces(trace)
    assert sorted(traces) == [1, 2, 3]
    order = HTTP_ORDER if protocol == "http" else GRPC_ORDER
    for number, records in traces.items():
        head = _head(records)
        assert head == {"id": number, "model_name": "doubler", "model_version": 1,
                        "request_id": f"r{number - 1}"}  # fmt: skip
        stamps = _stamps(records)
        assert tuple(sorted(stamps, key=stamps.__getitem__)) == order or (
            # the handler's start and its read are one instant over gRPC
            protocol == "grpc" and set(stamps) == set(order)
        )
        times = [stamps[name] for name in order]
        assert times == sorted(times), f"trace {number} out of order: {stamps}"
        assert stamps["COMPUTE_OUTPUT_START"] > stamps["COMPUTE_INPUT_END"]


def test_each_request_of_a_grpc_stream_is_a_trace_of_its_own(tmp_path: Path) -> None:
    """``ModelStreamInfer``: three requests on one stream, three traces, as Triton traces
    them; each ends when its response is queued for the stream."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "rate=1")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    x = np.arange(ROW, dtype=np.float32).reshape(1, ROW)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for n in range(3):
            tensor = grpcclient.InferInput("INPUT0", [1, ROW], "FP32")
            tensor.set_data_from_numpy(x + n)
            client.async_stream_infer("doubler", [tensor], request_id=f"s{n}")
        got = {}
        for _ in range(3):
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            got[result.get_response().id] = result.as_numpy("OUTPUT0")
        for n in range(3):
            np.testing.assert_array_equal(got[f"s{n}"], 2 * (x + n))
        client.stop_stream()
    finally:
        client.close()
        assert server.stop() == 0
    traces = _traces(trace)
    assert {_head(r)["request_id"] for r in traces.values()} == {"s0", "s1", "s2"}
    for records in traces.values():
        stamps = _stamps(records)
        assert set(stamps) == set(GRPC_ORDER)
        times = [stamps[name] for name in GRPC_ORDER]
        assert times == sorted(times), stamps


def test_generate_and_generate_stream_requests_are_traced_as_inferences(
    tmp_path: Path,
) -> None:
    """Triton's generate endpoints go through its inference path, so they are traced as
    inference requests over HTTP are: every timestamp, in order, the send ending when the
    body (or the stream's final event) is out. A body the model cannot take is a trace
    with its model and its receipt, and no REQUEST_END."""
    trace = tmp_path / "trace.json"
    repo = _repository(tmp_path / "repo")
    shutil.copytree(MODEL_REPO / "square_int32", repo / "square_int32")
    args = ["--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"]  # fmt: skip
    server = start_server(repo, args)
    row = list(range(ROW))
    base = f"http://{server.http_url}/v2/models/doubler"
    try:
        with httpx.Client(timeout=30) as http:
            answer = http.post(f"{base}/generate", json={"id": "g", "INPUT0": row})
            assert answer.status_code == 200, answer.text
            assert answer.json()["OUTPUT0"] == [2 * v for v in row]
            streamed = http.post(f"{base}/generate_stream", json={"id": "s", "INPUT0": row})
            assert streamed.status_code == 200, streamed.text
            (event,) = [line for line in streamed.text.splitlines() if line]
            assert json.loads(event.removeprefix("data: "))["id"] == "s"
            squares = f"http://{server.http_url}/v2/models/square_int32/generate_stream"
            streamed = http.post(squares, json={"id": "sq", "IN": 3})  # its final flag bare
            assert streamed.text.count("data: ") == 3, streamed.text
            refused = http.post(f"{base}/generate", json={"id": "x", "INPUT0": row[:-1]})
            assert refused.status_code == 400, refused.text
    finally:
        assert server.stop() == 0
    traces = list(_traces(trace).values())
    assert len(traces) == 4
    by_id = {_head(records).get("request_id", ""): records for records in traces}
    assert set(by_id) == {"g", "s", "sq", ""}  # the refused request never had its id read
    squares = _stamps(by_id["sq"])  # ended by its last response, the final flag unsent
    ends = [squares[name] for name in ("REQUEST_START", "REQUEST_END", "HTTP_SEND_END")]
    assert ends == sorted(ends), squares
    for request_id in ("g", "s"):
        stamps = _stamps(by_id[request_id])
        assert tuple(sorted(stamps, key=stamps.__getitem__)) == HTTP_ORDER, stamps
    refused_stamps = _stamps(by_id[""])
    assert set(refused_stamps) == {"HTTP_RECV_START", "HTTP_RECV_END"}, refused_stamps


def test_a_failed_request_is_traced_too(tmp_path: Path, protocol: str) -> None:
    """A request refused at decode (an input the model does not take) is a trace with its
    model and its start, as Triton writes one; with ``count=1`` at rate 1 it is the count's
    last, written to ``<file>.0`` at once."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "rate=1", "count=1")
    client = _client(server, protocol)
    try:
        module = httpclient if protocol == "http" else grpcclient
        wrong = module.InferInput("IN", [1, ROW], "FP32")  # the negater takes X
        wrong.set_data_from_numpy(np.ones((1, ROW), np.float32))
        with pytest.raises(InferenceServerException, match="unexpected input 'IN'"):
            client.infer("negater", [wrong], request_id="refused")
        wait_until(lambda: Path(f"{trace}.0").exists(), what="the count's indexed file")
    finally:
        client.close()
        assert server.stop() == 0
    ((_, records),) = _traces(Path(f"{trace}.0")).items()
    assert _head(records)["model_name"] == "negater"
    assert "REQUEST_END" not in _stamps(records)  # it never reached the model


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "workers"])
def test_an_ensemble_that_fails_in_a_step_is_traced_with_its_steps(
    tmp_path: Path, workers: str, protocol: str
) -> None:
    """The step that failed and the one before it are traces under the ensemble's, which
    failed: with workers too, where they ran in the model-owning process."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "rate=1",
                     workers=workers, extra=write_picking)  # fmt: skip
    client = _client(server, protocol)
    module = httpclient if protocol == "http" else grpcclient
    try:
        tensor = module.InferInput("IN", [1, ROW], "FP32")
        tensor.set_data_from_numpy(np.array([[0, 1, 1, 0]], np.float32))
        answer = client.infer(PICKING, [tensor], request_id="fine")
        np.testing.assert_array_equal(answer.as_numpy("OUT"), [[10, 12, 12, 10]])
        tensor.set_data_from_numpy(np.array([[0, 1, 50, 0]], np.float32))  # 100: past it
        with pytest.raises(InferenceServerException, match="picker"):
            client.infer(PICKING, [tensor], request_id="failed")
    finally:
        client.close()
        assert server.stop() == 0
    heads = [_head(records) for _, records in sorted(_traces(trace).items())]
    named = [(h["model_name"], h.get("parent_id"), h["request_id"]) for h in heads]
    assert named == [
        (PICKING, None, "fine"), ("doubler", 1, "fine"), ("picker", 1, "fine"),
        (PICKING, None, "failed"), ("doubler", 4, "failed"), ("picker", 4, "failed"),
    ]  # fmt: skip


def test_log_frequency_writes_indexed_files_as_the_traces_come(tmp_path: Path) -> None:
    """``log-frequency=2``: every two traces to the next ``<file>.N`` while the server runs,
    the odd one out at the stop, and no ``<file>`` at all."""
    trace = tmp_path / "trace.json"
    server = _server(
        tmp_path, f"triton,file={trace}", "triton,log-frequency=2", "level=TIMESTAMPS", "rate=1"
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        x = np.ones((1, ROW), np.float32)
        for n in range(5):
            _infer(client, "doubler", x, f"r{n}")
        wait_until(lambda: Path(f"{trace}.1").exists(), what="two indexed files while serving")
        assert not Path(f"{trace}.2").exists()
    finally:
        client.close()
        assert server.stop() == 0
    assert [sorted(_traces(Path(f"{trace}.{n}"))) for n in range(3)] == [[1, 2], [3, 4], [5]]
    assert not trace.exists()


def test_the_settings_api_answers_and_drives_the_trace_files(tmp_path: Path) -> None:
    """Triton's L0_trace sequence through tritonclient: tracing switched on through the API
    (what came before it untraced); a model's own log frequency writes its indexed files
    apart; a count set at rate 1 writes its traces to an indexed file the moment the last
    is collected, the traces before it to ``<file>`` as their setting ends; the file itself
    cannot be moved."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=OFF", "rate=1")
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.ones((1, ROW), np.float32)
    try:
        _infer(http, "doubler", x, "untraced")
        answer = http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]},
                                            headers=HEADERS)  # fmt: skip
        assert answer == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                          "log_frequency": "0", "trace_file": str(trace),
                          "trace_mode": "triton"}  # fmt: skip
        grpc_answer = grpc.get_trace_settings("negater", as_json=True)["settings"]
        assert grpc_answer["trace_file"] == {"value": [str(trace)]}
        assert grpc_answer["trace_mode"] == {"value": ["triton"]}
        moved = r"^\[501\] trace file location can not be updated through network protocol"
        with pytest.raises(InferenceServerException, match=moved):
            http.update_trace_settings("negater", {"trace_file": "elsewhere.json"},
                                       headers=HEADERS)  # fmt: skip
        http.update_trace_settings("negater", {"log_frequency": "1"}, headers=HEADERS)
        _infer(grpc, "negater", x, "own-1")
        wait_until(lambda: Path(f"{trace}.0").exists(), what="the model's own indexed file")
        for n in range(2):
            _infer(http, "doubler", x, f"global-{n}")
        http.update_trace_settings(settings={"trace_count": "2"}, headers=HEADERS)
        for n in range(3):
            _infer(grpc, "doubler", x, f"counted-{n}")
        wait_until(lambda: Path(f"{trace}.1").exists(), what="the count's indexed file")
        assert http.get_trace_settings()["trace_count"] == "0"
    finally:
        http.close()
        grpc.close()
        assert server.stop() == 0
    ids = {p: {_head(r)["request_id"] for r in _traces(p).values()}
           for p in (trace, Path(f"{trace}.0"), Path(f"{trace}.1"))}  # fmt: skip
    assert ids == {
        trace: {"global-0", "global-1"},  # written when the count was set
        Path(f"{trace}.0"): {"own-1"},
        Path(f"{trace}.1"): {"counted-0", "counted-1"},
    }


def test_tensors_level_writes_each_tensor_s_data(tmp_path: Path, protocol: str) -> None:
    """TENSORS: each input as it was queued and each output as the model wrote it, their
    values read back as ``trace_summary.py`` reads them (comma-separated)."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TENSORS", "rate=1")
    client = _client(server, protocol)
    x = np.array([[0.5, -1.25, 3e-8, 7.0]], np.float32)
    try:
        _infer(client, "doubler", x, "tensors")
    finally:
        client.close()
        assert server.stop() == 0
    ((_, records),) = _traces(trace).items()
    tensors = {(r["activity"], r["tensor"]["name"]): r["tensor"] for r in records
               if "activity" in r}  # fmt: skip
    assert set(tensors) == {("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT0")}
    for key, array in {"INPUT0": x, "OUTPUT0": 2 * x}.items():
        activity = "TENSOR_QUEUE_INPUT" if key == "INPUT0" else "TENSOR_BACKEND_OUTPUT"
        tensor = tensors[(activity, key)]
        assert (tensor["shape"], tensor["dtype"]) == ("1,4", "FP32")
        values = np.array([float(v) for v in tensor["data"].split(",")], np.float32)
        np.testing.assert_array_equal(values.reshape(1, ROW), array)
    assert "timestamps" not in json.dumps(records)  # TENSORS alone: no timestamps


@pytest.mark.parametrize(
    ("workers", "in_shared_memory"),
    [("1", False), ("2", False), ("2", True)],
    ids=["one-process", "workers", "workers-shared-memory"],
)
def test_an_ensemble_s_steps_are_traces_under_it_nested_ones_under_theirs(
    tmp_path: Path, workers: str, in_shared_memory: bool
) -> None:
    """Triton's numbering: the ensemble's request first, then each step as it starts (a
    nested ensemble's steps after it), each naming its parent and the request's id; the
    ensembles have no queue or compute of their own, their steps do. With workers the steps
    run in the model-owning process and come back to the worker with the answer, whether the
    worker checked the request (its input in the request) or the model-owning process reads
    it (its input in the client's shared memory)."""
    trace = tmp_path / "trace.json"
    server = _server(
        tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "level=TENSORS", "rate=1",
        workers=workers,
    )  # fmt: skip
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(ROW, dtype=np.float32).reshape(1, ROW)
    region = None
    try:
        if in_shared_memory:
            key = f"/trace-{tmp_path.name}"
            region = shm.create_shared_memory_region("x", key, x.nbytes)
            shm.set_shared_memory_region(region, [x])
            client.register_system_shared_memory("x", key, x.nbytes)
            tensor = httpclient.InferInput("X", list(x.shape), "FP32")
            tensor.set_shared_memory("x", x.nbytes)
            answer = client.infer(NESTED, [tensor], request_id="n1")
        else:
            answer = _infer(client, NESTED, x, "n1")
        np.testing.assert_array_equal(answer.as_numpy("Y"), 3 * x)
    finally:
        if region is not None:
            client.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(region)
        client.close()
        assert server.stop() == 0
    traces = _traces(trace)
    heads = {number: _head(records) for number, records in traces.items()}
    assert [(h["model_name"], h.get("parent_id")) for _, h in sorted(heads.items())] == [
        (NESTED, None),
        (ENSEMBLE, 1),
        ("doubler", 2),
        ("adder", 2),
    ]  # fmt: skip (the negater's NEG is not asked for: its step is pruned, as Triton does)
    assert {h["request_id"] for h in heads.values()} == {"n1"}
    for number, records in traces.items():
        stamps = _stamps(records)
        composite = heads[number]["model_name"] in (NESTED, ENSEMBLE)
        assert ("COMPUTE_INPUT_END" in stamps) is not composite
        assert ("QUEUE_START" in stamps) is not composite  # with workers too
        assert stamps["REQUEST_START"] <= stamps["REQUEST_END"]
    adder = {r["tensor"]["name"]: r["tensor"]["data"] for r in traces[4] if "activity" in r}
    assert {name: [float(v) for v in next(csv.reader([data]))] for name, data in adder.items()} == {
        "A": [0, 2, 4, 6], "B": [0, 1, 2, 3], "SUM": [0, 3, 6, 9],
    }  # fmt: skip


def _stream_decoupled(server: ServerProcess, model: str, values: list[int]) -> list[int]:
    """OUT of each response to one request to a decoupled ensemble over a gRPC stream."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: list[int] = []
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(model, stream_inputs(values, 5), request_id="d1",
                                  enable_empty_final_response=True)  # fmt: skip
        while True:
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            response = result.get_response()
            if response.outputs:
                got += result.as_numpy("OUT").tolist()
            if response.parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    finally:
        client.close()
    return got


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "workers"])
def test_a_decoupled_ensemble_s_steps_are_traced_the_decoupled_ones_too(
    tmp_path: Path, workers: str
) -> None:
    """A decoupled ensemble over a gRPC stream, as Triton traces it: its decoupled step is
    one trace, with each response's outputs at level TENSORS; the steps each response runs
    are traces of their own under the ensemble; a nested decoupled ensemble's steps are
    under it. Every step's timestamps in Triton's order (its start before its queue). With
    workers the steps come back to the worker with the stream's end."""
    trace = tmp_path / "trace.json"
    server = _server(
        tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "level=TENSORS", "rate=1",
        workers=workers, extra=write_decoupled,
    )  # fmt: skip
    try:
        assert sorted(_stream_decoupled(server, "fan_repeat", [1, 2, 3])) == [2, 4, 6]
        assert sorted(_stream_decoupled(server, "nested_square", [1, 2])) == [1, 2, 2]
    finally:
        assert server.stop() == 0
    traces = _traces(trace)
    heads = {number: _head(records) for number, records in traces.items()}
    assert {h["request_id"] for h in heads.values()} == {"d1"}
    named = sorted((h["model_name"], h.get("parent_id"), n) for n, h in heads.items())
    fan, nested = (n for m, _, n in named if m in ("fan_repeat", "nested_square"))
    steps = sorted((h["model_name"], h.get("parent_id")) for h in heads.values())
    assert steps == sorted([
        ("fan_repeat", None), ("repeat_int32", fan), *[("identity_int32", fan)] * 3,
        *[("adder_int32", fan)] * 3,
        ("nested_square", None), ("simple_repeat", nested), ("repeat_int32", nested + 1),
        *[("square_int32", nested)] * 2,
    ])  # fmt: skip
    assert heads[fan + 1]["model_name"] == "repeat_int32"  # numbered as the steps start
    assert heads[nested + 1]["model_name"] == "simple_repeat"
    for number, records in traces.items():
        stamps = _stamps(records)
        ordered = [name for name in HTTP_ORDER[2:10] if name in stamps]
        assert [stamps[name] for name in ordered] == sorted(stamps[n] for n in ordered), stamps
        batched = heads[number]["model_name"] in ("identity_int32", "adder_int32")
        assert ("QUEUE_START" in stamps) is batched, stamps
    repeat = traces[fan + 1]
    outputs = [r["tensor"] for r in repeat if r.get("activity") == "TENSOR_BACKEND_OUTPUT"]
    assert [(t["name"], t["data"]) for t in outputs] == [("OUT", "1"), ("OUT", "2"), ("OUT", "3")]
    inputs = {r["tensor"]["name"] for r in repeat if r.get("activity") == "TENSOR_QUEUE_INPUT"}
    assert inputs == {"IN", "DELAY", "WAIT"}


def test_workers_send_their_traces_to_the_file(tmp_path: Path) -> None:
    """With two request-handling workers, each traces its own requests and the
    model-owning process writes them, numbered apart."""
    trace = tmp_path / "trace.json"
    server = _server(tmp_path, f"triton,file={trace}", "level=TIMESTAMPS", "rate=1", workers="2")
    clients: list[Client] = [httpclient.InferenceServerClient(server.http_url),
                             grpcclient.InferenceServerClient(server.grpc_url)]  # fmt: skip
    x = np.ones((1, ROW), np.float32)
    try:
        for n in range(6):
            _infer(clients[n % 2], "doubler", x, f"w{n}")
    finally:
        for client in clients:
            client.close()
        assert server.stop() == 0
    traces = _traces(trace)
    assert sorted(traces) == list(range(1, 7))
    assert {_head(r)["request_id"] for r in traces.values()} == {f"w{n}" for n in range(6)}
    for records in traces.values():
        stamps = _stamps(records)
        order = HTTP_ORDER if "HTTP_RECV_START" in stamps else GRPC_ORDER
        assert set(stamps) == set(order)  # the batch's run stamps came back with the answer
        times = [stamps[name] for name in order]
        assert times == sorted(times), stamps


def test_a_trace_file_that_cannot_be_written_never_fails_a_request(tmp_path: Path) -> None:
    """Logged once; every request answered; the stop still clean."""
    unwritable = tmp_path / "gone" / "trace.json"  # its directory is never made
    server = _server(
        tmp_path, f"triton,file={unwritable}", "triton,log-frequency=1", "level=TIMESTAMPS",
        "rate=1",
    )  # fmt: skip
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.ones((1, ROW), np.float32)
    try:
        for n in range(3):
            np.testing.assert_array_equal(
                _infer(client, "doubler", x, f"r{n}").as_numpy("OUTPUT0"), 2 * x
            )
        assert server.wait_for("failed creating trace file", timeout=20)["path"] == str(unwritable)
    finally:
        client.close()
        assert server.stop() == 0
    assert sum(log.get("message") == "failed creating trace file" for log in server.logs) == 1
