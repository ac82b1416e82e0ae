"""A CNN with free height and width is counted in pixels: batches of large images hold fewer
rows, an image larger than its reservation runs alone on memory the device budget lends it,
one larger than the budget could lend is refused, and a model whose memory does not amplify
its requests (an identity over a free axis) is still counted in rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess, start_server, tree_memory_mib

CNN_CONFIG = """name: "cnn" max_batch_size: 64
input [{ name: "image" data_type: TYPE_FP32 dims: [3, -1, -1] }]
output [{ name: "features" data_type: TYPE_FP32 dims: [32] }]
dynamic_batching {}
"""
IDENTITY_CONFIG = """name: "identity" max_batch_size: 8
input [{ name: "IN" data_type: TYPE_INT32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }]
dynamic_batching {}
"""
PROBE_PIXELS = 128 * 128


def _save(root: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(config)


def _cnn() -> onnx.GraphProto:
    """Two padded 3x3 convolutions of 32 channels, pooled: what a pixel costs in memory is
    about 28 times the 12 bytes it carries in a request."""
    rng = np.random.default_rng(0)
    first = numpy_helper.from_array(rng.random((32, 3, 3, 3), dtype=np.float32), "first")
    second = numpy_helper.from_array(rng.random((32, 32, 3, 3), dtype=np.float32), "second")
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["image", "first"], ["a"], kernel_shape=[3, 3], pads=pads),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "second"], ["c"], kernel_shape=[3, 3], pads=pads),
        helper.make_node("GlobalAveragePool", ["c"], ["d"]),
        helper.make_node("Flatten", ["d"], ["features"]),
    ]
    return helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "h", "w"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 32])],
        initializer=[first, second],
    )


def _identity() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "identity",
        [helper.make_tensor_value_info("IN", TensorProto.INT32, ["N", "L"])],
        [helper.make_tensor_value_info("OUT", TensorProto.INT32, ["N", "L"])],
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image_positions")
    _save(root, "cnn", _cnn(), CNN_CONFIG)
    _save(root, "identity", _identity(), IDENTITY_CONFIG)
    return root


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def server(repo: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """One process, and two workers: a worker groups same-shaped requests into one work
    item, which must hold no more pixels than a batch may."""
    started = start_server(repo, extra_env={"BATCHSERVE_WORKERS": request.param})
    yield started
    assert started.stop() == 0


def _stats(server: ServerProcess, model: str) -> dict[str, object]:
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    return dict(httpx.get(url, timeout=10).json()["model_stats"][0])


def _batch_counts(server: ServerProcess) -> dict[int, int]:
    rows = _stats(server, "cnn")["batch_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in rows}  # type: ignore[attr-defined]


def _images(client: httpx.Client, url: str, rows: int, size: int) -> httpx.Response:
    """``rows`` images of ``size`` x ``size`` as binary data (a JSON list of 48 MiB of
    floats would be slower to build than to serve)."""
    data = np.random.default_rng(size).random((rows, 3, size, size), dtype=np.float32)
    header = json.dumps({"inputs": [{
        "name": "image", "datatype": "FP32", "shape": list(data.shape),
        "parameters": {"binary_data_size": data.nbytes},
    }]}).encode()  # fmt: skip
    return client.post(
        url,
        content=header + data.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def test_the_reservation_is_counted_in_pixels_for_the_cnn_and_in_rows_for_identity(
    server: ServerProcess,
) -> None:
    cnn = _stats(server, "cnn")["batchserve"]
    assert cnn["batch_steps"] == 64 * PROBE_PIXELS  # type: ignore[index]
    for instance in cnn["instances"]:  # type: ignore[index]
        assert instance["batch_steps"] == 64 * PROBE_PIXELS
        assert instance["per_sample_bytes"] > 8 * 12 * PROBE_PIXELS  # amplified past 8
    identity = _stats(server, "identity")["batchserve"]
    assert identity["batch_steps"] == 0  # type: ignore[index]


def test_large_images_batch_in_fewer_rows_within_the_pixels_reserved(
    server: ServerProcess,
) -> None:
    """512 x 512 images are 16 probe rows each: at most four to a batch, where a batch of 32
    such images would have needed eight times the memory reserved."""
    pid = server.process.pid
    before_rss, before = tree_memory_mib(pid), _batch_counts(server)
    url = f"http://{server.http_url}/v2/models/cnn/infer"
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(max_workers=32) as pool:
        codes = list(pool.map(lambda _: _images(client, url, 1, 512).status_code, range(48)))
    assert codes == [200] * 48
    ran = [size for size, count in _batch_counts(server).items() if count > before.get(size, 0)]
    assert max(ran) <= 4
    assert max(ran) > 1, "concurrent requests should have been batched"
    assert tree_memory_mib(pid) - before_rss < 300  # a batch of 32 took 2.7 GiB more


def test_an_image_over_the_pixels_reserved_runs_alone_on_memory_lent_and_given_back(
    server: ServerProcess,
) -> None:
    """One 2048 x 2048 image is four times the pixels reserved: the device budget lends the
    rest for its run, and ONNX Runtime's arena gives it back after (it kept 1.1 GiB)."""
    pid = server.process.pid
    url = f"http://{server.http_url}/v2/models/cnn/infer"
    with httpx.Client(timeout=120) as client:
        assert _images(client, url, 4, 512).status_code == 200  # the arena at the reservation
        before = tree_memory_mib(pid)
        for _ in range(2):  # without the shrink, a second one grew the arena again
            served = _images(client, url, 1, 2048)
            assert served.status_code == 200, served.text
            assert served.json()["outputs"][0]["shape"] == [1, 32]
    assert tree_memory_mib(pid) - before < 300


def test_identity_over_a_free_axis_serves_a_row_far_past_the_probe_s(
    server: ServerProcess,
) -> None:
    """Its memory is of the order of its requests': counted in positions at the probe's 128
    a row, a row of 100,000 would have been refused."""
    url = f"http://{server.http_url}/v2/models/identity/infer"
    values = list(range(100_000))
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 100_000], "data": values}]}
    answer = httpx.post(url, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == values


@pytest.fixture(scope="module")
def small_budget(repo: Path) -> Iterator[ServerProcess]:
    """A CPU budget that holds the reservations but not what a 2048 x 2048 image needs
    beyond them (about 1 GiB)."""
    started = start_server(repo, ["--memory-budget", "cpu=900MiB"])
    yield started
    assert started.stop() == 0


def test_an_image_the_budget_could_not_lend_for_is_refused_naming_the_tensor(
    small_budget: ServerProcess,
) -> None:
    url = f"http://{small_budget.http_url}/v2/models/cnn/infer"
    with httpx.Client(timeout=60) as client:
        over = _images(client, url, 1, 2048)
        assert over.status_code == 400
        error = over.json()["error"]
        assert error.startswith(
            "input 'image': 1 row(s) of 2048 x 2048 are 4194304 positions, more than a batch "
            f"of model 'cnn' may hold ({64 * PROBE_PIXELS} positions, derived from its memory "
            "budget), and the "
        )
        assert "more it needs is more than the cpu budget has unreserved (" in error
        assert error.endswith("send smaller or fewer rows, or raise batchserve.max_batch_steps")
        assert _images(client, url, 1, 1024).status_code == 200  # the pixels reserved
    image = np.zeros((1, 3, 2048, 2048), np.float32)
    with grpcclient.InferenceServerClient(small_budget.grpc_url) as client:
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("cnn", [tensor])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "4194304 positions" in str(refused.value.message())
