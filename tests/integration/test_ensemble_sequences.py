"""An ensemble whose step is a sequence model: the request's sequence parameters reach that
step as Triton's ensemble passes them (to every step; a model that does not batch sequences
ignores them there), so a pre-processing step can feed a stateful model. By one process and
by two request-handling workers, over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.zoo.sequence_models import write_accumulator
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import write_ensemble
from tests.integration.server import ServerProcess, start_server

SCALER = """name: "scaler"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "X" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [1] }]
dynamic_batching { }
"""

ENSEMBLE = """name: "scaled_sum"
platform: "ensemble"
max_batch_size: 8
input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "SUM" data_type: TYPE_INT32 dims: [1] }]
ensemble_scheduling { step [
  { model_name: "scaler" model_version: -1
    input_map { key: "X" value: "IN" } output_map { key: "Y" value: "scaled" } },
  { model_name: "accumulator" model_version: -1
    input_map { key: "INPUT" value: "scaled" } output_map { key: "OUTPUT" value: "SUM" } }
] }
"""
"""SUM: the running sum of 10 x IN over the request's sequence (``accumulator`` keeps it)."""

STATELESS = """name: "scaled_only"
platform: "ensemble"
max_batch_size: 8
input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]
ensemble_scheduling { step [
  { model_name: "scaler" model_version: -1
    input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }
] }
"""


def _write_scaler(repo: Path) -> None:
    ten = helper.make_tensor("ten", TensorProto.INT32, [], [10])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "ten"], ["Y"])], "scaler",
        [helper.make_tensor_value_info("X", TensorProto.INT32, ["batch", 1])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["batch", 1])], [ten],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (repo / "scaler" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "scaler" / "1" / "model.onnx"))
    (repo / "scaler" / "config.pbtxt").write_text(SCALER)


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ensemble_sequences")
    _write_scaler(repo)
    write_accumulator(repo)
    write_ensemble(repo, ENSEMBLE, "scaled_sum")
    write_ensemble(repo, STATELESS, "scaled_only")
    running = start_server(repo, ["--workers", request.param])
    yield running
    assert running.stop() == 0


def _infer(module: ModuleType, server: ServerProcess, model: str, value: int,
           **sequence: object) -> int:  # fmt: skip
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        tensor = module.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        output = "SUM" if model == "scaled_sum" else "OUT"
        return int(client.infer(model, [tensor], **sequence).as_numpy(output)[0, 0])
    finally:
        client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_interleaved_sequences_through_an_ensemble_each_keep_their_own_sum(
    server: ServerProcess, module: ModuleType
) -> None:
    sums: dict[int, list[int]] = {7: [], 8: []}
    for step, (a, b) in enumerate([(1, 5), (2, 6), (3, 7)]):
        last = step == 2
        for sequence_id, value in ((7, a), (8, b)):
            sums[sequence_id].append(_infer(
                module, server, "scaled_sum", value, sequence_id=sequence_id,
                sequence_start=step == 0, sequence_end=last,
            ))  # fmt: skip
    assert sums == {7: [10, 30, 60], 8: [50, 110, 180]}


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_step_without_sequences_ignores_them_and_a_sequence_step_needs_them(
    server: ServerProcess, module: ModuleType
) -> None:
    """The sequence parameters reach only the steps that batch sequences; an ensemble
    none of whose steps does refuses them, as a model without sequence batching does; and
    the sequence step refuses a request without them in its own words, after the
    ensemble's name."""
    first = _infer(module, server, "scaled_sum", 4, sequence_id=9, sequence_start=True)
    assert first == 40  # the scaler ran with the sequence's request and ignored its id
    assert _infer(module, server, "scaled_sum", 1, sequence_id=9, sequence_end=True) == 50
    with pytest.raises(InferenceServerException) as refused:
        _infer(module, server, "scaled_only", 1, sequence_id=10, sequence_start=True)
    assert "model 'scaled_only' does not use sequence batching (nor does any step" in (
        refused.value.message()
    )
    with pytest.raises(InferenceServerException) as missing:
        _infer(module, server, "scaled_sum", 1)
    assert missing.value.message().startswith("in ensemble 'scaled_sum', "), missing.value
    assert _infer(module, server, "scaled_only", 3) == 30
