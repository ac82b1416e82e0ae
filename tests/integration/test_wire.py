"""The HTTP/gRPC wire as Triton's: compressed bodies, raw binary requests, nested JSON data
and the error texts NVIDIA's clients read, against a real server."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.rest.compression import MAX_GZIP_MEMBERS
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess

DIGITS = "digits_cnn"
LSTM = "char_lstm"


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 17, (batch, 1, 8, 8)).astype(np.float32)


def _http_infer(
    client: httpclient.InferenceServerClient, images: np.ndarray, **options: str
) -> np.ndarray:
    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    result = client.infer(DIGITS, [tensor], **options)
    logits = result.as_numpy("logits")
    assert logits is not None
    return logits


@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
def test_tritonclient_compression_options(
    http: httpclient.InferenceServerClient,
    request_coding: str | None,
    response_coding: str | None,
) -> None:
    images = _images(3)
    expected = _http_infer(http, images)
    got = _http_infer(
        http,
        images,
        request_compression_algorithm=request_coding,  # type: ignore[arg-type]
        response_compression_algorithm=response_coding,  # type: ignore[arg-type]
    )
    np.testing.assert_array_equal(got, expected)


def test_responses_are_compressed_as_accept_encoding_asks(raw: httpx.Client) -> None:
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                        "data": _images(1).ravel().tolist()}]}  # fmt: skip
    plain = raw.post(
        f"/v2/models/{DIGITS}/infer", json=body, headers={"Accept-Encoding": "identity"}
    )
    headers = {"Accept-Encoding": "br, gzip;q=0.4, deflate;q=0.9"}
    packed = raw.post(f"/v2/models/{DIGITS}/infer", json=body, headers=headers)
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "deflate"
    assert int(packed.headers["content-length"]) < len(plain.content)
    assert packed.json() == plain.json()  # httpx inflates it


def test_unknown_encodings_and_zip_bombs_are_refused(raw: httpx.Client) -> None:
    refused = raw.post(
        f"/v2/models/{DIGITS}/infer", content=b"xx", headers={"Content-Encoding": "br"}
    )
    assert refused.status_code == 400
    assert refused.headers["accept-encoding"] == "gzip, deflate"
    assert refused.json()["error"].startswith("Unsupported compression type (batchserve: ")
    bomb = gzip.compress(b" " * (64 << 20), 9)  # 64 MiB of JSON whitespace, 16 MiB limit
    assert len(bomb) < 1 << 20
    over = raw.post(f"/v2/models/{DIGITS}/infer", content=bomb,
                    headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert over.status_code == 413
    assert over.json()["error"].startswith("Decompressed data size exceeds the maximum allowed")
    broken = raw.post(f"/v2/models/{DIGITS}/infer", content=gzip.compress(b"{}")[:-4],
                      headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert broken.status_code == 400
    assert "truncated" in broken.json()["error"]


def test_a_body_of_many_gzip_members_is_read_up_to_the_limit(raw: httpx.Client) -> None:
    """Each member costs a fresh inflater, and each used to copy the rest of the body: two
    bodies of 4 MiB of empty members held the server for 31 s, other requests waiting up to
    12 s."""
    images = _images(2)
    request = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 1, 8, 8],
                           "data": images.ravel().tolist()}]}  # fmt: skip
    body = orjson.dumps(request)
    plain = raw.post(f"/v2/models/{DIGITS}/infer", content=body)
    assert plain.status_code == 200, plain.text
    empty = gzip.compress(b"", mtime=0)
    members = gzip.compress(body) + empty * (MAX_GZIP_MEMBERS - 1)
    gzip_headers = {"Content-Encoding": "gzip"}
    packed = raw.post(f"/v2/models/{DIGITS}/infer", content=members, headers=gzip_headers)
    assert packed.status_code == 200, packed.text
    assert packed.json() == plain.json()
    over = raw.post(f"/v2/models/{DIGITS}/infer", content=members + empty, headers=gzip_headers)
    assert over.status_code == 400
    assert f"more than {MAX_GZIP_MEMBERS} gzip members" in over.json()["error"]


def test_a_raw_binary_body_is_the_one_input(
    raw: httpx.Client, http: httpclient.InferenceServerClient
) -> None:
    image = _images(1)
    response = raw.post(
        f"/v2/models/{DIGITS}/infer",
        content=image.tobytes(),
        headers={
            "Inference-Header-Content-Length": "0",
            "Content-Type": "application/octet-stream",
        },
    )
    assert response.status_code == 200, response.text
    header_length = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:header_length])
    assert [(o["name"], o["shape"]) for o in doc["outputs"]] == [
        ("logits", [1, 10]), ("probabilities", [1, 10])
    ]  # fmt: skip
    size = doc["outputs"][0]["parameters"]["binary_data_size"]
    logits = np.frombuffer(response.content[header_length : header_length + size], np.float32)
    np.testing.assert_array_equal(logits, _http_infer(http, image)[0])


def test_a_raw_binary_body_for_a_model_with_two_inputs_gets_tritons_text(
    raw: httpx.Client,
) -> None:
    response = raw.post(
        f"/v2/models/{LSTM}/infer", content=bytes(16),
        headers={"Inference-Header-Content-Length": "0"},
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'char_lstm' model configuration"
    )
    short = raw.post(f"/v2/models/{DIGITS}/infer", content=bytes(100),
                     headers={"Inference-Header-Content-Length": "0"})  # fmt: skip
    assert short.status_code == 400
    assert short.json()["error"].startswith(
        "input byte size mismatch for input 'image' for model 'digits_cnn'. Expected 256, got 100"
    )


def test_json_data_nested_as_triton_reads_it(raw: httpx.Client) -> None:
    image = _images(1)
    flat = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
            "data": image.ravel().tolist()}  # fmt: skip
    rows = [[value] for value in image.ravel().tolist()]  # 64 x 1: deeper than the shape says
    nested = {**flat, "data": [[rows[:10]], rows[10:]]}  # and ragged
    answers = [raw.post(f"/v2/models/{DIGITS}/infer", json={"inputs": [t]}) for t in (flat, nested)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["outputs"] == answers[1].json()["outputs"]


def test_server_metadata_is_what_nvidias_examples_check(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    assert http.get_server_metadata()["name"] == "triton"
    assert grpc_client.get_server_metadata().name == "triton"


def test_unknown_models_and_versions_get_tritons_text(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException) as missing:
            client.get_model_metadata("wrong_model_name")
        assert "Request for unknown model: 'wrong_model_name' is not found" in str(
            missing.value.message()
        )
        with pytest.raises(InferenceServerException) as version:
            client.get_model_metadata(DIGITS, "9")
        assert str(version.value.message()).startswith(
            f"Request for unknown model: '{DIGITS}' version 9 is not found"
        )
    with pytest.raises(InferenceServerException) as on_grpc:
        grpc_client.get_model_metadata("wrong_model_name")
    assert on_grpc.value.status() == "StatusCode.NOT_FOUND"


def test_grpc_texts_and_codes(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient
) -> None:
    image = _images(1)
    tensor = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(image)
    twice = [grpcclient.InferRequestedOutput("logits")] * 2
    with pytest.raises(InferenceServerException) as duplicate:
        grpc_client.infer(DIGITS, [tensor], outputs=twice)
    assert duplicate.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert str(duplicate.value.message()).startswith("output 'logits' already exists in request")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=DIGITS)
        both = request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
        both.contents.fp32_contents.extend(image.ravel().tolist())
        request.raw_input_contents.append(image.tobytes())
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith(
            "contents field must not be specified when using raw_input_contents for 'image'"
        )
        del request.raw_input_contents[:]
        both.ClearField("contents")
        request.raw_input_contents.append(image.tobytes()[:200])
        with pytest.raises(grpc.RpcError) as size:
            stub.ModelInfer(request)
        assert size.value.details().startswith(
            "input byte size mismatch for input 'image' for model 'digits_cnn'. Expected 256, "
            "got 200"
        )
        del both.shape[:]
        both.shape.extend([1, -1, 8, 8])
        with pytest.raises(grpc.RpcError) as negative:
            stub.ModelInfer(request)
        assert negative.value.details().startswith(
            "All input dimensions should be specified for input 'image', got [1, -1, 8, 8]"
        )


def test_batchserve_client_asks_for_uncompressed_answers(server: ServerProcess) -> None:
    """httpx offers gzip by default; batchserve's client must not pay for it."""
    from batchserve_client._http import HttpRequest
    from batchserve_client._http_io import HttpRunner

    body = orjson.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                                     "data": _images(1).ravel().tolist()}]})  # fmt: skip
    runner = HttpRunner(f"http://{server.http_url}", headers={}, connect_timeout=5)
    try:
        answer = runner.send(HttpRequest("POST", f"/v2/models/{DIGITS}/infer", body), 30)
        assert answer.status_code == 200
        assert "content-encoding" not in answer.headers
        asked = HttpRequest("POST", f"/v2/models/{DIGITS}/infer", body, {"Accept-Encoding": "gzip"})
        assert runner.send(asked, 30).headers["content-encoding"] == "gzip"
    finally:
        runner.close()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_grpc_compression(
    grpc_client: grpcclient.InferenceServerClient,
    http: httpclient.InferenceServerClient,
    coding: str,
) -> None:
    """gRPC message compression is grpc's own; NVIDIA's grpc client offers it per call."""
    images = _images(2)
    tensor = grpcclient.InferInput("image", [2, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(images)
    result = grpc_client.infer(DIGITS, [tensor], compression_algorithm=coding)
    np.testing.assert_array_equal(result.as_numpy("logits"), _http_infer(http, images))


def test_tritonclient_http_aio_compression(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    """The asyncio client inflates answers itself (aiohttp's auto_decompress is off)."""
    import tritonclient.http.aio as aioclient

    images = _images(2)

    async def infer() -> np.ndarray:
        client = aioclient.InferenceServerClient(server.http_url)
        try:
            tensor = aioclient.InferInput("image", [2, 1, 8, 8], "FP32")
            tensor.set_data_from_numpy(images)
            result = await client.infer(
                DIGITS, [tensor], request_compression_algorithm="deflate",
                response_compression_algorithm="gzip",
            )  # fmt: skip
            logits = result.as_numpy("logits")
            assert logits is not None
            return logits
        finally:
            await client.close()

    np.testing.assert_array_equal(asyncio.run(infer()), _http_infer(http, images))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_compromised_shape_gets_tritons_byte_size_text(
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    protocol: str,
) -> None:
    """Triton's own test of this (L0_input_validation): data for one shape, then the shape
    set to a smaller one; Triton's text names the input and the model."""
    module = httpclient if protocol == "http" else grpcclient
    client = http if protocol == "http" else grpc_client
    tensor = module.InferInput("image", [1, 80], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.zeros((1, 80), dtype=np.float32))
    tensor.set_shape([1, 1, 8, 8])
    with pytest.raises(InferenceServerException) as caught:
        client.infer(DIGITS, [tensor])
    assert (
        f"input byte size mismatch for input 'image' for model '{DIGITS}'. Expected 256, got 320"
        in str(caught.value)
    )
