"""Ragged batching through a real server, called with NVIDIA's clients: requests of
different lengths share batches unpadded, the batcher's index tells the model where each
starts, and scattered outputs come back in each request's own shape. With two workers too,
whose requests must not travel to the model as one (the index counts requests).
"""

from __future__ import annotations

import queue
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess, start_server
from tests.ragged_models import (
    RAGGED_SUMS_CONFIG,
    ragged_sums_model,
    save_ragged_models,
    save_ragged_sums_pt2,
)

WARMED = (
    RAGGED_SUMS_CONFIG.replace('name: "ragged_sums"', 'name: "ragged_warmed"')
    + """
model_warmup [{
  name: "three rows" batch_size: 3 count: 2
  inputs { key: "VALUES" value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } }
}]
"""
)


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def ragged_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("ragged_repo")
    save_ragged_models(repo)
    save_ragged_sums_pt2(repo)
    (repo / "ragged_warmed" / "1").mkdir(parents=True)
    (repo / "ragged_warmed" / "1" / "model.onnx").write_bytes(
        ragged_sums_model().SerializeToString()
    )
    (repo / "ragged_warmed" / "config.pbtxt").write_text(WARMED)
    server = start_server(repo, ["--workers", request.param])
    yield server
    assert server.stop() == 0


def _values(length: int, scale: float) -> np.ndarray:
    return (np.arange(1, length + 1, dtype=np.float32) * scale).reshape(1, length)


def _infer(server: ServerProcess, protocol: str, values: np.ndarray, model: str) -> Any:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("VALUES", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return client.infer(model, [tensor])


def _executions(server: ServerProcess, model: str) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    entry = stats["model_stats"][0]
    return int(entry["inference_count"]), int(entry["execution_count"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("lengths", ["mixed", "equal"])
def test_concurrent_requests_of_any_length_each_get_their_own_answer(
    ragged_server: ServerProcess, protocol: str, lengths: str
) -> None:
    """Equal lengths too: a worker must not send them on as one request of several rows."""
    rng = random.Random(7)
    sizes = [rng.randint(1, 9) if lengths == "mixed" else 4 for _ in range(64)]
    before = _executions(ragged_server, "ragged_sums")
    with ThreadPoolExecutor(16) as pool:
        sent = [_values(n, i + 1) for i, n in enumerate(sizes)]
        results = list(pool.map(lambda v: _infer(ragged_server, protocol, v, "ragged_sums"), sent))
    for values, result in zip(sent, results, strict=True):
        assert result.as_numpy("SUM").tolist() == [[float(values.sum())]]
        np.testing.assert_array_equal(result.as_numpy("ECHO"), values)
        counts = result.as_numpy("COUNTS")[0].tolist()
        assert values.size in counts  # the batch it ran in, as the model was told it
        assert result.as_numpy("LONGEST")[0][0] == max(counts)
    inferences, executions = _executions(ragged_server, "ragged_sums")
    assert inferences - before[0] == len(sizes)
    assert executions - before[1] < len(sizes)  # they shared batches


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_pytorch_backend_batches_ragged_requests_as_onnx_runtime_does(
    ragged_server: ServerProcess, protocol: str
) -> None:
    """The merge, the index and the scatter are the scheduler's, so a ``torch.export``
    program takes them by name as an ONNX model does: each request's own sum and echo,
    whatever batch it shared."""
    rng = random.Random(11)
    sent = [_values(rng.randint(1, 9), i + 1) for i in range(48)]
    before = _executions(ragged_server, "ragged_sums_pt2")
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(lambda v: _infer(ragged_server, protocol, v, "ragged_sums_pt2"), sent)
        )
    for values, result in zip(sent, results, strict=True):
        np.testing.assert_allclose(result.as_numpy("SUM"), [[float(values.sum())]], rtol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("ECHO"), values)
    inferences, executions = _executions(ragged_server, "ragged_sums_pt2")
    assert inferences - before[0] == len(sent)
    assert executions - before[1] < len(sent)  # they shared batches


def test_a_stream_of_tritons_qa_shapes(ragged_server: ServerProcess) -> None:
    """The requests of Triton's L0_batch_input, down one gRPC stream."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for length in (2, 4, 1, 3):
            tensor = grpcclient.InferInput("VALUES", [1, length], "FP32")
            tensor.set_data_from_numpy(np.full([1, length], length, np.float32))
            client.async_stream_infer("ragged_sums", [tensor], request_id=str(length))
        results = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    for result in results:
        assert not isinstance(result, Exception), result
        length = int(result.get_response().id)
        assert result.as_numpy("SUM").tolist() == [[float(length * length)]]
        assert result.as_numpy("ECHO").tolist() == [[float(length)] * length]


def test_item_shapes_over_http(ragged_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(ragged_server.http_url)
    for shape in ([2, 1, 2], [1, 3, 5]):
        tensor = httpclient.InferInput("GRID", shape, "FP32")
        tensor.set_data_from_numpy(np.zeros(shape, np.float32))
        result = client.infer("item_areas", [tensor])
        assert result.as_numpy("AREA").tolist() == [[float(shape[1] * shape[2])]] * shape[0]


def test_a_warm_up_sample_runs_as_requests_of_one_row(ragged_server: ServerProcess) -> None:
    """Its three rows reach the model as three requests, as Triton's warm-up sends them,
    with the tensors the batcher computes: without those the run, and the load, fail."""
    assert _infer(ragged_server, "http", _values(3, 1), "ragged_warmed").as_numpy(
        "SUM"
    ).tolist() == [[6.0]]


def test_the_config_shows_the_batch_inputs_and_outputs(ragged_server: ServerProcess) -> None:
    config = httpclient.InferenceServerClient(ragged_server.http_url).get_model_config(
        "ragged_sums"
    )
    assert [entry["target_name"] for entry in config["batch_input"]] == [
        ["OFFSETS"], ["ELEMENTS"], ["RUNNING"], ["MAX_SHAPE"]
    ]  # fmt: skip
    assert config["batch_output"][0]["kind"] == "BATCH_SCATTER_WITH_INPUT_SHAPE"
    assert [tensor["name"] for tensor in config["input"]] == ["VALUES"]
