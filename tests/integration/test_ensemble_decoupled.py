"""Ensembles with a decoupled step, as Triton's L0_decoupled serves them: each response of
the decoupled step runs the steps after it once, the ensemble answers each time its outputs
are written and ends with a final flag; an ensemble containing one is decoupled itself.
Over a gRPC stream and HTTP generate_stream, by one process and by two workers."""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from batchserve.zoo.sequence_models import write_accumulator
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import write_ensemble
from tests.integration.server import MODEL_REPO, ServerProcess, start_server

IO = """input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""
REPEAT_STEP = """{ model_name: "repeat_int32" model_version: -1
  input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
  input_map { key: "WAIT" value: "WAIT" } output_map { key: "OUT" value: "%s" } %s }"""

ENSEMBLES = {
    # repeat's responses straight out
    "simple_repeat": (REPEAT_STEP % ("OUT", 'output_map { key: "IDX" value: "IDX" }'),
                      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
                      '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]'),
    # each of repeat's responses doubled by two steps after it (one reads the other)
    "fan_repeat": (REPEAT_STEP % ("repeat_out", "")
                   + ', { model_name: "identity_int32" input_map { key: "INPUT0" value: '
                   '"repeat_out" } output_map { key: "OUTPUT0" value: "identity_out" } }, '
                   '{ model_name: "adder_int32" input_map { key: "A" value: "repeat_out" } '
                   'input_map { key: "B" value: "identity_out" } output_map { key: "SUM" '
                   'value: "OUT" } }',
                   'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'),
    # a decoupled step after a decoupled step: square answers N times for each N
    "repeat_square": (REPEAT_STEP % ("repeat_out", "")
                      + ', { model_name: "square_int32" input_map { key: "IN" value: '
                      '"repeat_out" } output_map { key: "OUT" value: "OUT" } }',
                      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'),
    # a decoupled ensemble as a step
    "nested_square": ('{ model_name: "simple_repeat" input_map { key: "IN" value: "IN" } '
                      'input_map { key: "DELAY" value: "DELAY" } input_map { key: "WAIT" '
                      'value: "WAIT" } output_map { key: "OUT" value: "repeat_out" } }, '
                      '{ model_name: "square_int32" input_map { key: "IN" value: '
                      '"repeat_out" } output_map { key: "OUT" value: "OUT" } }',
                      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'),
    # a sequence model after repeat: the request's sequence parameters reach each of its
    # requests (Triton passes them to every step, flags included)
    "repeat_accumulate": (REPEAT_STEP % ("repeat_out", "")
                          + ', { model_name: "accumulator" input_map { key: "INPUT" value: '
                          '"repeat_out" } output_map { key: "OUTPUT" value: "OUT" } }',
                          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'),
}  # fmt: skip


def _write_onnx(repo: Path, name: str, node: onnx.NodeProto, inputs: list[str],
                output: str) -> None:  # fmt: skip
    def info(tensor: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor, TensorProto.INT32, ["n"])

    graph = helper.make_graph([node], name, [info(n) for n in inputs], [info(output)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ -1 ] }}' for n in inputs)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\ninput [ {tensors} ]\n'
        f'output [ {{ name: "{output}" data_type: TYPE_INT32 dims: [ -1 ] }} ]\n'
    )


def write_repository(repo: Path) -> None:
    for model in ("repeat_int32", "square_int32"):
        shutil.copytree(MODEL_REPO / model, repo / model)
    write_accumulator(repo)
    _write_onnx(repo, "identity_int32", helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
                ["INPUT0"], "OUTPUT0")  # fmt: skip
    _write_onnx(repo, "adder_int32", helper.make_node("Add", ["A", "B"], ["SUM"]),
                ["A", "B"], "SUM")  # fmt: skip
    for name, (steps, outputs) in ENSEMBLES.items():
        config = (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{IO}{outputs}\n'
                  f"ensemble_scheduling {{ step [ {steps} ] }}\n")  # fmt: skip
        write_ensemble(repo, config, name)


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("decoupled_ensembles")
    write_repository(repo)
    running = start_server(repo, ["--workers", request.param])
    yield running
    assert running.stop() == 0


def stream_inputs(values: list[int], delay_ms: int) -> list[grpcclient.InferInput]:
    tensors = [grpcclient.InferInput("IN", [len(values)], "INT32"),
               grpcclient.InferInput("DELAY", [len(values)], "UINT32"),
               grpcclient.InferInput("WAIT", [1], "UINT32")]  # fmt: skip
    tensors[0].set_data_from_numpy(np.array(values, np.int32))
    tensors[1].set_data_from_numpy(np.full(len(values), delay_ms, np.uint32))
    tensors[2].set_data_from_numpy(np.zeros(1, np.uint32))
    return tensors


def _stream(server: ServerProcess, model: str, values: list[int], delay_ms: int = 20,
            **sequence: object) -> list[tuple[list[int] | None, bool]]:  # fmt: skip
    """Each response to one request over a gRPC stream: OUT (None: a bare final flag), and
    whether it is marked final."""
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(
            model, stream_inputs(values, delay_ms), request_id="r1",
            outputs=[grpcclient.InferRequestedOutput("OUT")], enable_empty_final_response=True,
            **sequence,
        )  # fmt: skip
        got: list[tuple[list[int] | None, bool]] = []
        while True:
            item = answers.get(timeout=30)
            if isinstance(item, InferenceServerException):
                raise item
            response = item.get_response()  # type: ignore[attr-defined]
            assert response.id == "r1"
            final = response.parameters["triton_final_response"].bool_param
            out = item.as_numpy("OUT").tolist() if response.outputs else None  # type: ignore[attr-defined]
            got.append((out, final))
            if final:
                return got
    finally:
        client.stop_stream()
        client.close()


def test_each_response_of_the_decoupled_step_comes_out_of_the_ensemble(
    server: ServerProcess,
) -> None:
    assert _stream(server, "simple_repeat", [7, 8, 9]) == [
        ([7], False), ([8], False), ([9], False), (None, True)
    ]  # fmt: skip
    assert _stream(server, "simple_repeat", []) == [(None, True)]  # Triton's one-to-none


def test_the_steps_after_a_decoupled_step_run_once_per_response(server: ServerProcess) -> None:
    assert _stream(server, "fan_repeat", [3, 4, 5]) == [
        ([6], False), ([8], False), ([10], False), (None, True)
    ]  # fmt: skip


@pytest.mark.parametrize("model", ["repeat_square", "nested_square"])
def test_a_decoupled_step_after_a_decoupled_step_answers_for_each_of_its_inputs(
    server: ServerProcess, model: str
) -> None:
    """Square answers N times for each N that repeat (or an ensemble of it) sends, in the
    order repeat sent them (L0_decoupled's _nested_validate)."""
    got = _stream(server, model, [2, 3], delay_ms=100)
    assert got == [([2], False)] * 2 + [([3], False)] * 3 + [(None, True)]


def test_a_decoupled_ensemble_is_decoupled_and_refuses_one_answer_calls(
    server: ServerProcess,
) -> None:
    """Triton marks an ensemble with a decoupled step decoupled, and refuses ModelInfer
    for it in its words; HTTP generate_stream relays every response."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config("repeat_square", as_json=True)["config"]
        assert config["model_transaction_policy"] == {"decoupled": True}
        with pytest.raises(InferenceServerException) as refused:
            client.infer("repeat_square", stream_inputs([1], 0))
        assert refused.value.message().startswith(
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )
    finally:
        client.close()
    body = {"IN": [3], "DELAY": [0], "WAIT": [0]}
    with httpx.Client(timeout=30) as http:
        streamed = http.post(
            f"http://{server.http_url}/v2/models/fan_repeat/generate_stream", json=body
        )
    events = [
        json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")
    ]
    assert [event["OUT"] for event in events] == [6]


def test_the_decoupled_steps_model_counts_the_step_as_a_request(server: ServerProcess) -> None:
    def executions() -> int:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            stats = client.get_inference_statistics("square_int32", as_json=True)
        finally:
            client.close()
        return int(stats["model_stats"][0].get("execution_count", 0))

    before = executions()
    _stream(server, "repeat_square", [1, 2, 1], delay_ms=0)
    assert executions() - before == 3  # one square request per repeat response


def test_a_sequence_step_after_a_decoupled_step_gets_the_requests_sequence(
    server: ServerProcess,
) -> None:
    """Through workers too: a stream's sequence parameters travel with the request to the
    model-owning process. Each of the accumulator's requests carries the request's flags
    (START on each here: each sums one value); without an id its step refuses, in its words
    after the ensemble's."""
    sequence = {"sequence_id": 42, "sequence_start": True, "sequence_end": True}
    got = _stream(server, "repeat_accumulate", [4, 5], **sequence)
    assert got == [([4], False), ([5], False), (None, True)]
    with pytest.raises(InferenceServerException) as refused:
        _stream(server, "repeat_accumulate", [4])
    assert refused.value.message().startswith(
        "in ensemble 'repeat_accumulate', inference request to model 'accumulator' must "
        "specify a non-zero or non-empty correlation ID"
    )
