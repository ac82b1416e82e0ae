"""The KServe v2 / Triton protocol, spoken by NVIDIA's own clients against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import batchserve
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, ServerProcess


@pytest.fixture(scope="module")
def server(server_either_way: ServerProcess) -> ServerProcess:
    """Every test here against one process and against two workers."""
    return server_either_way


DIGITS = "digits_cnn"
LSTM = "char_lstm"


def _session(model: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(MODEL_REPO / model / "1" / "model.onnx"))


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _digits(batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(batch, 1, 8, 8)).astype(np.float32)


def _tokens(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    for row, length in enumerate(lengths):
        tokens[row, :length] = rng.integers(3, 98, size=length)
    return tokens, np.array(lengths, dtype=np.int64)[:, None]


def test_health_on_both_protocols(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    assert http.is_server_live()
    assert http.is_server_ready()
    assert grpc.is_server_live()
    assert grpc.is_server_ready()
    for model in (DIGITS, LSTM):
        for client in (http, grpc):
            assert client.is_model_ready(model)
            assert client.is_model_ready(model, "1")
            assert not client.is_model_ready(model, "2")
    # A model the server has never heard of: not ready, and no error (gRPC: Triton answers
    # ready=false with status OK, so tritonclient returns False instead of raising).
    for client in (http, grpc):
        assert client.is_model_ready("no_such_model") is False


def test_server_metadata(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    meta = http.get_server_metadata()
    # what NVIDIA's simple_{http,grpc}_health_metadata.py check
    assert meta["name"] == "triton"
    assert grpc.get_server_metadata().name == "triton"
    assert meta["version"] == batchserve.__version__
    assert meta["extensions"] == list(grpc.get_server_metadata().extensions)
    for extension in ("binary_tensor_data", "model_configuration", "statistics", "parameters",
                      "sequence"):  # fmt: skip
        assert extension in meta["extensions"]


def test_model_metadata_describes_batch_axis(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    meta = http.get_model_metadata(DIGITS)
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
    assert meta["versions"] == ["1"]
    grpc_meta = grpc.get_model_metadata(LSTM)
    assert [(t.name, t.datatype, list(t.shape)) for t in grpc_meta.inputs] == [
        ("tokens", "INT64", [-1, -1]),
        ("lengths", "INT64", [-1, 1]),
    ]


def test_model_config_matches_on_both_protocols(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    config = http.get_model_config(DIGITS)
    assert config["max_batch_size"] == 64
    assert config["input"][0]["dims"] == [1, 8, 8]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    grpc_config = grpc.get_model_config(LSTM).config
    assert grpc_config.name == LSTM
    # batchserve's own settings travel as field 1000, which Triton's message skips.
    assert http.get_model_config(LSTM)["batchserve"]["sequence_length_input"] == "lengths"
    assert grpc_config.HasField("dynamic_batching")


def test_served_config_shows_where_instances_run_as_triton_shows_it(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    # digits_cnn's config names no instance group: the server adds one after the model and
    # chooses its device (KIND_AUTO), which the served config shows resolved, as Triton's does
    config = http.get_model_config(DIGITS)
    assert [group["name"] for group in config["instance_group"]] == [DIGITS]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"  # no GPU this ONNX Runtime uses
    assert config["default_model_filename"] == "model.onnx"
    grpc_groups = grpc.get_model_config(DIGITS).config.instance_group
    kind_cpu = model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert [(group.name, group.kind) for group in grpc_groups] == [(DIGITS, kind_cpu)]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_digits_match_in_process_onnxruntime(
    http: httpclient.InferenceServerClient, binary: bool
) -> None:
    images = _digits(5)
    inp = httpclient.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("logits", "probabilities")
    ]
    result = http.infer(DIGITS, [inp], outputs=outputs, request_id="r1")
    expected_logits, expected_probs = _session(DIGITS).run(None, {"image": images})
    np.testing.assert_allclose(result.as_numpy("logits"), expected_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), expected_probs, rtol=1e-5, atol=1e-6
    )
    assert result.get_response()["id"] == "r1"


def test_grpc_lstm_matches_in_process_onnxruntime(grpc: grpcclient.InferenceServerClient) -> None:
    tokens, lengths = _tokens([12, 5, 30])
    inputs = [grpcclient.InferInput("tokens", list(tokens.shape), "INT64"),
              grpcclient.InferInput("lengths", list(lengths.shape), "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(lengths)
    result = grpc.infer(LSTM, inputs)
    (expected,) = _session(LSTM).run(None, {"tokens": tokens, "lengths": lengths})
    np.testing.assert_allclose(result.as_numpy("next_char_logits"), expected, rtol=1e-4, atol=1e-5)


def test_requested_output_subset_over_grpc(grpc: grpcclient.InferenceServerClient) -> None:
    images = _digits(2, seed=3)
    inp = grpcclient.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    result = grpc.infer(DIGITS, [inp], outputs=[grpcclient.InferRequestedOutput("probabilities")])
    assert result.as_numpy("logits") is None
    assert result.as_numpy("probabilities").shape == (2, 10)


def test_asyncio_clients(server: ServerProcess) -> None:
    asyncio.run(_asyncio_clients(server))


async def _asyncio_clients(server: ServerProcess) -> None:
    import tritonclient.grpc.aio as grpc_aio
    import tritonclient.http.aio as http_aio

    images = _digits(3, seed=7)
    (expected, _) = _session(DIGITS).run(None, {"image": images})
    http_client = http_aio.InferenceServerClient(server.http_url)
    grpc_client = grpc_aio.InferenceServerClient(server.grpc_url)
    try:
        h_in = http_aio.InferInput("image", list(images.shape), "FP32")
        h_in.set_data_from_numpy(images)
        g_in = grpc_aio.InferInput("image", list(images.shape), "FP32")
        g_in.set_data_from_numpy(images)
        h_result = await http_client.infer(DIGITS, [h_in])
        g_result = await grpc_client.infer(DIGITS, [g_in])
    finally:
        await http_client.close()
        await grpc_client.close()
    np.testing.assert_allclose(h_result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)


def test_statistics_count_what_was_served(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    before = http.get_inference_statistics(DIGITS)["model_stats"][0]["inference_count"]
    images = _digits(4, seed=9)
    inp = httpclient.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    http.infer(DIGITS, [inp])
    stats = grpc.get_inference_statistics(DIGITS).model_stats[0]
    assert stats.inference_count == before + 4
    assert stats.inference_stats.success.count >= 1
    assert stats.execution_count >= 1


def test_errors_name_the_problem_and_the_server_keeps_answering(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    wrong = np.zeros((1, 1, 8, 8), dtype=np.int64)
    h_in = httpclient.InferInput("image", [1, 1, 8, 8], "INT64")
    h_in.set_data_from_numpy(wrong)
    with pytest.raises(InferenceServerException, match=r"image.*INT64.*FP32") as exc:
        http.infer(DIGITS, [h_in])
    assert exc.value.status() == "400"
    g_in = grpcclient.InferInput("image", [1, 1, 8, 8], "INT64")
    g_in.set_data_from_numpy(wrong)
    with pytest.raises(InferenceServerException, match="image") as gexc:
        grpc.infer(DIGITS, [g_in])
    assert gexc.value.status() == "StatusCode.INVALID_ARGUMENT"
    for refused in (exc.value, gexc.value):  # Triton's words first, as its clients read them
        assert str(refused.message()).startswith(
            "inference input 'image' data-type is 'INT64', but model 'digits_cnn' expects 'FP32'"
        )
    narrow = np.zeros((1, 1, 8, 7), dtype=np.float32)
    h_shape = httpclient.InferInput("image", [1, 1, 8, 7], "FP32")
    h_shape.set_data_from_numpy(narrow)
    with pytest.raises(InferenceServerException) as h_shape_exc:
        http.infer(DIGITS, [h_shape])
    assert h_shape_exc.value.status() == "400"
    g_shape = grpcclient.InferInput("image", [1, 1, 8, 7], "FP32")
    g_shape.set_data_from_numpy(narrow)
    with pytest.raises(InferenceServerException) as g_shape_exc:
        grpc.infer(DIGITS, [g_shape])
    assert g_shape_exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    for refused in (h_shape_exc.value, g_shape_exc.value):
        assert str(refused.message()).startswith(
            "unexpected shape for input 'image' for model 'digits_cnn'. "
            "Expected [-1,1,8,8], got [1,1,8,7]"
        )
    with pytest.raises(InferenceServerException, match="nope") as missing:
        http.get_model_metadata("nope")
    assert missing.value.status() == "404"
    test_http_digits_match_in_process_onnxruntime(http, binary=True)


def test_openapi_document_lists_every_route(server: ServerProcess) -> None:
    import httpx

    document = httpx.get(f"http://{server.http_url}/openapi.json").json()
    paths = set(document["paths"])
    for route in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}/infer",
                  "/v2/models/{name}/versions/{version}/infer", "/v2/models/{name}/config",
                  "/v2/models/{name}/stats", "/v2/repository/index"):  # fmt: skip
        assert route in paths
    assert "requestBody" in document["paths"]["/v2/models/{name}/infer"]["post"]


def test_stream_infer_answers_every_request_with_its_id(
    grpc: grpcclient.InferenceServerClient,
) -> None:
    import queue

    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(4):
            images = _digits(1, seed=20 + i)
            inp = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
            inp.set_data_from_numpy(images)
            grpc.async_stream_infer(DIGITS, [inp], request_id=f"s{i}")
        bad = grpcclient.InferInput("image", [1, 1, 8, 8], "INT64")
        bad.set_data_from_numpy(np.zeros((1, 1, 8, 8), dtype=np.int64))
        grpc.async_stream_infer(DIGITS, [bad], request_id="bad")
        results = [answers.get(timeout=30) for _ in range(5)]
    finally:
        grpc.stop_stream()
    ids = {r.get_response().id for r, e in results if e is None}  # type: ignore[attr-defined]
    errors = [e for _, e in results if e is not None]
    assert ids == {"s0", "s1", "s2", "s3"}
    assert len(errors) == 1
    assert "image" in str(errors[0])


def test_sequence_flags_to_a_model_without_sequence_batching_are_refused(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        image = module.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(_digits(1))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(DIGITS, [image], sequence_id=7, sequence_start=True)
        assert "model 'digits_cnn' does not use sequence batching" in refused.value.message()
