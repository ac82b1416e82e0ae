"""Stateful sequences through a real server, by Triton's own clients: the flow of NVIDIA's
sequence examples (sync over HTTP and gRPC, and a gRPC stream), interleaved sequences with
implicit state, and the errors Triton gives. By one process and by two workers."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.zoo.sequence_models import (
    accumulator_nodes,
    write_accumulator,
    write_simple_sequence,
)
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, metric, run_perf_analyzer, start_server

VALUES = [11, 7, 5, 3, 2, 0, 1]  # what NVIDIA's examples send after their first value


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def sequence_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("sequence_repo")
    write_simple_sequence(repo)
    write_accumulator(repo)
    two_slots = write_accumulator(repo, "accumulator_two_slots") / "config.pbtxt"
    config = two_slots.read_text().replace("max_batch_size: 8", "max_batch_size: 2")
    two_slots.write_text(config + "instance_group [{ count: 1 kind: KIND_CPU }]\n")
    _write_unbatched_accumulator(repo)
    _write_accumulator_from_a_file(repo)
    server = start_server(repo, ["--workers", request.param])
    yield server
    assert server.stop() == 0


UNBATCHED = """name: "accumulator_unbatched"
backend: "onnxruntime"
max_batch_size: 0
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  oldest { max_candidate_sequences: 4 }
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
    { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] }
  ]
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1] }]
}
"""
"""The accumulator as Triton's QA writes its nobatch sequence models: no batch axis."""


def _write_unbatched_accumulator(repo: Path) -> None:
    nodes, constants = accumulator_nodes()
    int32 = [helper.make_tensor_value_info(n, TensorProto.INT32, [1])
             for n in ("INPUT", "START", "READY", "ACC_IN", "OUTPUT", "ACC_OUT")]  # fmt: skip
    graph = helper.make_graph(nodes, "unbatched", int32[:4], int32[4:], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (repo / "accumulator_unbatched" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "accumulator_unbatched" / "1" / "model.onnx"))
    (repo / "accumulator_unbatched" / "config.pbtxt").write_text(UNBATCHED)


FROM_A_FILE = """name: "accumulator_from_100"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }]
sequence_batching {
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1]
           initial_state [{ data_type: TYPE_INT32 dims: [1] data_file: "input_state_data"
                            name: "from file" }] }]
}
"""


def _write_accumulator_from_a_file(repo: Path) -> None:
    """OUTPUT = ACC_OUT = ACC_IN + INPUT, the sum starting at 100, read from the state's
    initial_state data file, as L0_sequence_batcher's INITIAL_STATE_FILE models start."""
    nodes = [helper.make_node("Add", ["ACC_IN", "INPUT"], ["ACC_OUT"]),
             helper.make_node("Identity", ["ACC_OUT"], ["OUTPUT"])]  # fmt: skip
    int32 = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
             for n in ("ACC_IN", "INPUT", "ACC_OUT", "OUTPUT")]  # fmt: skip
    model = helper.make_model(
        helper.make_graph(nodes, "from_100", int32[:2], int32[2:]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    folder = repo / "accumulator_from_100"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(FROM_A_FILE)
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "input_state_data").write_bytes(np.array([100], np.int32).tobytes())


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_initial_state_from_a_data_file_starts_each_sequence(
    sequence_server: ServerProcess, module: ModuleType
) -> None:
    """The state of each START is the file's (100), not zeros; such a config used to be
    refused at load."""
    client = _client(module, sequence_server)
    assert _send(module, client, "accumulator_from_100", 81, [1, 2, 3]) == [101, 103, 106]
    assert _send(module, client, "accumulator_from_100", 82, [5]) == [105]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_sequence_model_without_batching_keeps_each_sequence_s_state(
    sequence_server: ServerProcess, module: ModuleType
) -> None:
    """Triton's nobatch sequence models (L0_sequence_batcher with NO_BATCHING=1): the
    controls and the state have no batch axis, and interleaved sequences keep their own
    sums. Such a model used to be refused at load."""
    client = _client(module, sequence_server)
    model = "accumulator_unbatched"

    def step(sequence_id: int, value: int, **flags: bool) -> int:
        tensor = module.InferInput("INPUT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)  # type: ignore[attr-defined]
        return int(result.as_numpy("OUTPUT")[0])

    assert step(71, 1, sequence_start=True) == 1
    assert step(72, 10, sequence_start=True) == 10
    assert step(71, 2) == 3
    assert step(72, 20) == 30
    assert step(71, 3, sequence_end=True) == 6
    assert step(72, 30, sequence_end=True) == 60
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(71, 4)


def _client(module: ModuleType, server: ServerProcess) -> object:
    url = server.http_url if module is httpclient else server.grpc_url
    return module.InferenceServerClient(url)


def _input(module: ModuleType, value: int) -> object:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def _send(module: ModuleType, client: object, model: str, sequence_id: int | str,
          values: list[int]) -> list[int]:  # fmt: skip
    results = []
    for index, value in enumerate(values):
        result = client.infer(  # type: ignore[attr-defined]
            model, [_input(module, value)], sequence_id=sequence_id,
            sequence_start=index == 0, sequence_end=index == len(values) - 1,
        )  # fmt: skip
        results.append(int(result.as_numpy("OUTPUT")[0, 0]))
    return results


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_sync_example_flow_gets_the_example_s_answers(
    sequence_server: ServerProcess, module: ModuleType
) -> None:
    """Two integer sequences and one with a UUID string id, as NVIDIA's sync examples send
    them to simple_sequence; the answers they check: INPUT + 1 on START, INPUT after."""
    client = _client(module, sequence_server)
    first = _send(module, client, "simple_sequence", 1000, [0, *VALUES])
    second = _send(module, client, "simple_sequence", 1001, [100, *(-v for v in VALUES)])
    text = _send(module, client, "simple_sequence", str(uuid.uuid4()), [20, *(-v for v in VALUES)])
    assert first == [1, *VALUES]
    assert second == [101, *(-v for v in VALUES)]
    assert text == [21, *(-v for v in VALUES)]


def test_a_grpc_stream_carries_a_sequence_in_order(sequence_server: ServerProcess) -> None:
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    values = [4, *VALUES]
    for index, value in enumerate(values):
        client.async_stream_infer(
            "accumulator", [_input(grpcclient, value)], request_id=str(index),
            sequence_id=4242, sequence_start=index == 0, sequence_end=index == len(values) - 1,
        )  # fmt: skip
    got = {}
    for _ in values:
        answer = answers.get(timeout=30)
        assert not isinstance(answer, InferenceServerException), answer.message()
        got[int(answer.get_response().id)] = int(answer.as_numpy("OUTPUT")[0, 0])
    client.stop_stream()
    assert [got[i] for i in range(len(values))] == list(np.cumsum(values))


def test_interleaved_concurrent_sequences_each_keep_their_own_state(
    sequence_server: ServerProcess,
) -> None:
    def run(sequence_id: int) -> list[int]:
        module = httpclient if sequence_id % 2 else grpcclient
        client = _client(module, sequence_server)
        values = [sequence_id * 10 + step for step in range(12)]
        try:
            return _send(module, client, "accumulator", sequence_id, values)
        finally:  # an HTTP client left to the collector fails in a thread without its hub
            client.close()  # type: ignore[attr-defined]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(1, 17)))
    for sequence_id, result in enumerate(results, start=1):
        values = [sequence_id * 10 + step for step in range(12)]
        assert result == list(np.cumsum(values)), sequence_id


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_triton_s_errors_for_sequences(sequence_server: ServerProcess, module: ModuleType) -> None:
    client = _client(module, sequence_server)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("accumulator", [_input(module, 1)], sequence_id=777)  # type: ignore[attr-defined]
    assert "inference request for sequence 777 to model 'accumulator' must specify the START " \
        "flag on the first request of the sequence" in unknown.value.message()  # fmt: skip
    with pytest.raises(InferenceServerException) as missing:
        client.infer("accumulator", [_input(module, 1)])  # type: ignore[attr-defined]
    assert "must specify a non-zero or non-empty correlation ID" in missing.value.message()
    _send(module, client, "accumulator", 778, [1, 2])  # started and ended
    with pytest.raises(InferenceServerException, match="sequence 778"):
        client.infer("accumulator", [_input(module, 1)], sequence_id=778)  # type: ignore[attr-defined]


def test_live_sequences_are_on_the_metrics_port(sequence_server: ServerProcess) -> None:
    client = _client(httpclient, sequence_server)
    before = metric(sequence_server, "batchserve_sequences_live", model="accumulator")
    client.infer("accumulator", [_input(httpclient, 1)], sequence_id=901, sequence_start=True)  # type: ignore[attr-defined]
    assert metric(sequence_server, "batchserve_sequences_live", model="accumulator") == before + 1
    client.infer("accumulator", [_input(httpclient, 1)], sequence_id=901, sequence_end=True)  # type: ignore[attr-defined]
    assert metric(sequence_server, "batchserve_sequences_live", model="accumulator") == before
    assert metric(sequence_server, "batchserve_sequences_expired_total", model="accumulator") == 0


def test_a_sequence_past_the_candidate_slots_waits_until_one_ends(
    sequence_server: ServerProcess,
) -> None:
    """direct: one candidate per batch slot (2 here); a third sequence waits in the backlog,
    as in Triton, and runs once a slot frees."""
    model = "accumulator_two_slots"

    def step(sequence_id: int, value: int, **flags: bool) -> int:
        client = _client(httpclient, sequence_server)  # one per thread, as gevent needs
        try:
            result = client.infer(  # type: ignore[attr-defined]
                model, [_input(httpclient, value)], sequence_id=sequence_id, **flags
            )
        finally:
            client.close()  # type: ignore[attr-defined]
        return int(result.as_numpy("OUTPUT")[0, 0])

    assert step(31, 1, sequence_start=True) == 1
    assert step(32, 2, sequence_start=True) == 2
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(step, 33, 3, sequence_start=True)
        assert not wait([waiting], timeout=0.5).done  # held in the backlog
        assert metric(sequence_server, "batchserve_sequences_backlog", model=model) == 1
        assert step(32, 5) == 7  # the candidates keep running
        assert step(31, 1, sequence_end=True) == 2
        assert waiting.result(timeout=10) == 3
    assert metric(sequence_server, "batchserve_sequences_backlog", model=model) == 0
    assert step(33, 4, sequence_end=True) == 7
    assert step(32, 1, sequence_end=True) == 8


def test_a_backlogged_sequence_past_its_request_timeout_is_refused_and_dropped(
    sequence_server: ServerProcess,
) -> None:
    """L0_sequence_batcher's request-timeout test over a gRPC stream: a sequence waiting
    for a slot past its request's timeout (Triton's 'timeout' parameter) is refused with
    Triton's UNAVAILABLE text, and its later END without START is refused too. It used to
    wait for the slot, and then run."""
    model = "accumulator_two_slots"
    http = _client(httpclient, sequence_server)
    assert http.infer(model, [_input(httpclient, 1)], sequence_id=41, sequence_start=True)  # type: ignore[attr-defined]
    assert http.infer(model, [_input(httpclient, 2)], sequence_id=42, sequence_start=True)  # type: ignore[attr-defined]
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for value, start in ((3, True), (4, False)):
            client.async_stream_infer(
                model, [_input(grpcclient, value)], sequence_id=43, sequence_start=start,
                timeout=200_000,  # microseconds
            )  # fmt: skip
        errors = [answers.get(timeout=10) for _ in range(2)]
    finally:
        client.stop_stream()
    for error in errors:
        assert isinstance(error, InferenceServerException), error
        # a stream's error carries its text only, no status
        assert error.message().startswith("timeout of the corresponding sequence has been expired")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        http.infer(model, [_input(httpclient, 5)], sequence_id=43, sequence_end=True)  # type: ignore[attr-defined]
    for sequence_id in (41, 42):
        http.infer(model, [_input(httpclient, 0)], sequence_id=sequence_id, sequence_end=True)  # type: ignore[attr-defined]


def test_perf_analyzer_drives_sequences_cleanly(sequence_server: ServerProcess) -> None:
    """perf_analyzer reads the sequence config and sends ids with START and END itself."""
    before = metric(
        sequence_server, "batchserve_requests_total", model="accumulator", outcome="success"
    )
    for protocol, url in (("http", sequence_server.http_url), ("grpc", sequence_server.grpc_url)):
        run_perf_analyzer("accumulator", protocol, url, "--concurrency-range", "4",
                          "--sequence-length", "5")  # fmt: skip
    assert (
        metric(sequence_server, "batchserve_requests_total", model="accumulator", outcome="success")
        > before
    )
    assert metric(sequence_server, "batchserve_sequences_expired_total", model="accumulator") == 0
