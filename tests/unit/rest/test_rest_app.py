"""The HTTP application in-process: real dataplane, registry and batcher over a fake backend."""

from __future__ import annotations

import gzip
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.core.settings import Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.rest.app import build_http_app
from batchserve.scheduler.memory import MemoryBudgets
from fakes import FAKE_CONFIG, FakeBackend
from onnx_models import FP32, build_model, write_model

pytestmark = pytest.mark.anyio


def _repository(root: Path) -> ModelRepository:
    model = build_model([("x", FP32, ("N", 4))], [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
    write_model(root / "fake" / "1" / "model.onnx", model)
    (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG)
    return ModelRepository(root)


def _budgets() -> MemoryBudgets:
    return MemoryBudgets(parse_budgets(None), device_total_bytes)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(model_repository=tmp_path, max_json_body_bytes=4096)
    registry = ModelRegistry(
        _repository(tmp_path), 8, _budgets(), lambda config, path: FakeBackend()
    )
    dataplane = DataPlane(settings, registry, ["fake"])
    await registry.load("fake")
    transport = httpx.ASGITransport(app=build_http_app(dataplane, settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await registry.close()


def _body(data: list[float], shape: list[int]) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}


async def test_json_inference_returns_every_output(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4], [1, 4]))
    assert response.status_code == 200
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["y"]["data"] == [3, 5, 7, 9]
    assert outputs["total"] == {"name": "total", "datatype": "FP32", "shape": [1, 1], "data": [10]}


async def test_binary_request_and_response(client: httpx.AsyncClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = orjson.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    })  # fmt: skip
    response = await client.post(
        "/v2/models/fake/versions/1/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200
    length = int(response.headers["inference-header-content-length"])
    meta = orjson.loads(response.content[:length])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == x.nbytes
    y = np.frombuffer(response.content[length:], dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(y, x * 2 + 1)


async def test_requests_repeating_a_header_each_get_their_own_answer(
    client: httpx.AsyncClient,
) -> None:
    """The second and later requests with one JSON header reuse its decoding (and its
    validation); their answers must still come from their own bytes."""
    header = orjson.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                    "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "total", "parameters": {"binary_data": False}}],
    })  # fmt: skip
    for start in range(4):
        x = np.arange(start, start + 4, dtype=np.float32).reshape(1, 4)
        response = await client.post(
            "/v2/models/fake/infer",
            content=header + x.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert response.status_code == 200
        outputs = response.json()["outputs"]
        assert [o["name"] for o in outputs] == ["total"]
        assert outputs[0]["data"] == [float(x.sum())]
    short = await client.post(
        "/v2/models/fake/infer",
        content=header + bytes(12),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert short.status_code == 400
    assert "binary_data_size 16 runs past the end of the body" in short.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v2/models/nope/infer", _body([1, 2, 3, 4], [1, 4]), 404, "nope"),
        ("/v2/models/fake/versions/7/infer", _body([1, 2, 3, 4], [1, 4]), 404, "version '7'"),
        ("/v2/models/fake/infer", _body([1, 2, 3], [1, 3]), 400, "'x'"),
        ("/v2/models/fake/infer", _body([1, 2, 3, 4], [1, 2]), 400, "'x'"),
        ("/v2/models/%2e%2e%2fetc/infer", _body([1, 2, 3, 4], [1, 4]), 400, "name"),
        ("/v2/models/fake/infer", {"inputs": [{"name": "x"}]}, 400, "x"),
    ],
)
async def test_bad_requests_get_a_clear_error(
    client: httpx.AsyncClient, path: str, body: object, status: int, fragment: str
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == status
    assert fragment in response.json()["error"]
    good = await client.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4], [1, 4]))
    assert good.status_code == 200


async def test_malformed_json_is_400_not_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/fake/infer", content=b'{"inputs":[')
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]


async def test_body_over_the_json_limit_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/fake/infer", content=b"[" * 5000)
    assert response.status_code == 413


async def test_a_json_header_over_the_json_limit_is_413_whatever_the_binary_limit(
    client: httpx.AsyncClient,
) -> None:
    """Inference-Header-Content-Length claiming the whole body used to have it parsed as JSON
    under the binary limit (64 MiB by default, 2 GB of server memory for such a body)."""
    padding = b" " * 5000  # JSON may carry whitespace: a valid body, over the 4096-byte limit
    body = orjson.dumps(_body([1, 2, 3, 4], [1, 4])) + padding
    response = await client.post(
        "/v2/models/fake/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(body))},
    )
    assert response.status_code == 413
    assert response.json()["error"] == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
        "4096 bytes. Use --http-max-input-size to increase the limit."
    )
    within = orjson.dumps(_body([1, 2, 3, 4], [1, 4]))
    served = await client.post(
        "/v2/models/fake/infer",
        content=within,
        headers={"Inference-Header-Content-Length": str(len(within))},
    )
    assert served.status_code == 200


async def test_not_ready_model_is_503_with_retry_after(tmp_path: Path) -> None:
    settings = Settings(model_repository=tmp_path)
    registry = ModelRegistry(
        _repository(tmp_path), 8, _budgets(), lambda config, path: FakeBackend()
    )
    app = build_http_app(DataPlane(settings, registry, ["fake"]), settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        response = await c.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4], [1, 4]))
        ready = await c.get("/v2/health/ready")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert ready.status_code == 503


async def test_without_strict_readiness_the_server_is_ready_once_the_start_up_loads_end(
    tmp_path: Path,
) -> None:
    """Triton starts its endpoints after its start-up loads, so even its non-strict
    readiness never answers 200 while they run."""
    settings = Settings(model_repository=tmp_path, strict_readiness=False)
    registry = ModelRegistry(
        _repository(tmp_path), 8, _budgets(), lambda config, path: FakeBackend()
    )
    dataplane = DataPlane(settings, registry, ["fake"])
    app = build_http_app(dataplane, settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        loading = await c.get("/v2/health/ready")
        dataplane.startup_done = True  # as the runtime says once every model was tried
        loaded = await c.get("/v2/health/ready")
    assert (loading.status_code, loaded.status_code) == (503, 200)
    await registry.close()


async def test_routes_outside_inference_use_the_error_shape(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v2/nothing-here")
    assert missing.status_code == 404
    assert "error" in missing.json()
    wrong_method = await client.put("/v2/health/live")
    assert wrong_method.status_code == 405
    control = await client.post("/v2/repository/models/fake/load")
    assert control.status_code == 503
    assert "model-control-mode explicit" in control.json()["error"]


async def test_config_and_statistics(client: httpx.AsyncClient) -> None:
    config = (await client.get("/v2/models/fake/config")).json()
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [4]
    await client.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4, 5, 6, 7, 8], [2, 4]))
    stats = (await client.get("/v2/models/fake/stats")).json()["model_stats"][0]
    assert stats["inference_count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 1
    all_stats = (await client.get("/v2/models/stats")).json()["model_stats"]
    assert [s["name"] for s in all_stats] == ["fake"]


@pytest.mark.parametrize("window_us", [0, 50_000])
async def test_an_inference_starts_busy_polling_only_when_configured(
    tmp_path: Path, window_us: int
) -> None:
    settings = Settings(model_repository=tmp_path, busy_poll_us=window_us)
    registry = ModelRegistry(_repository(tmp_path), 8, _budgets(), lambda c, p: FakeBackend())
    dataplane = DataPlane(settings, registry, ["fake"])
    await registry.load("fake")
    transport = httpx.ASGITransport(app=build_http_app(dataplane, settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4], [1, 4]))
    assert response.status_code == 200
    assert dataplane.busy_poll.polling is bool(window_us)
    await registry.close()


async def test_a_gzip_request_and_a_deflate_response(client: httpx.AsyncClient) -> None:
    body = orjson.dumps(_body([1, 2, 3, 4], [1, 4]))
    headers = {"Content-Encoding": "gzip", "Accept-Encoding": "deflate"}
    response = await client.post(
        "/v2/models/fake/infer", content=gzip.compress(body), headers=headers
    )
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "deflate"
    # httpx opens the deflate body itself; the length sent is the compressed one
    assert int(response.headers["content-length"]) < len(response.content)
    assert {o["name"]: o["data"] for o in response.json()["outputs"]}["y"] == [3, 5, 7, 9]


async def test_a_binary_response_is_compressed_whole(client: httpx.AsyncClient) -> None:
    doc = {**_body([1, 2, 3, 4], [1, 4]), "parameters": {"binary_data_output": True}}
    response = await client.post(
        "/v2/models/fake/infer", json=doc, headers={"Accept-Encoding": "gzip"}
    )
    assert response.headers["content-encoding"] == "gzip"
    header_length = int(response.headers["inference-header-content-length"])
    outputs = orjson.loads(response.content[:header_length])["outputs"]
    y = np.frombuffer(response.content[header_length : header_length + 16], np.float32)
    assert outputs[0]["parameters"]["binary_data_size"] == 16
    assert y.tolist() == [3, 5, 7, 9]


async def test_an_unknown_content_encoding_names_the_ones_accepted(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v2/models/fake/infer", content=b"\x00", headers={"Content-Encoding": "br"}
    )
    assert response.status_code == 400
    assert response.headers["accept-encoding"] == "gzip, deflate"
    assert response.json()["error"].startswith("Unsupported compression type")


async def test_a_zip_bomb_is_413_and_the_server_goes_on(client: httpx.AsyncClient) -> None:
    bomb = gzip.compress(b"[" * (2 << 20), 9)  # 2 MiB of JSON in ~2 KiB: under the limit as sent
    assert len(bomb) < 4096
    response = await client.post(
        "/v2/models/fake/infer", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert response.status_code == 413
    assert response.json()["error"].startswith("Decompressed data size exceeds the maximum")
    good = await client.post("/v2/models/fake/infer", json=_body([1, 2, 3, 4], [1, 4]))
    assert good.status_code == 200


async def test_a_raw_binary_body_is_the_models_one_input(client: httpx.AsyncClient) -> None:
    raw = np.array([1, 2, 3, 4], np.float32).tobytes()
    headers = {"Inference-Header-Content-Length": "0"}
    response = await client.post("/v2/models/fake/infer", content=raw, headers=headers)
    assert response.status_code == 200
    header_length = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:header_length])
    assert [(o["name"], o["shape"]) for o in doc["outputs"]] == [("y", [1, 4]), ("total", [1, 1])]
    y = np.frombuffer(response.content[header_length : header_length + 16], np.float32)
    assert y.tolist() == [3, 5, 7, 9]
    short = await client.post("/v2/models/fake/infer", content=raw[:12], headers=headers)
    assert short.status_code == 400
    assert short.json()["error"].startswith(
        "input byte size mismatch for input 'x' for model 'fake'. Expected 16"
    )


async def test_an_unexpected_error_in_a_route_is_a_json_500_logged_with_its_traceback(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: DataPlane) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(DataPlane, "server_metadata", broken)
    with caplog.at_level(logging.ERROR):
        response = await client.get("/v2")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": "internal error: RuntimeError"}  # no internals shown
    (record,) = [r for r in caplog.records if r.exc_info is not None]
    assert record.levelno == logging.ERROR
    assert str(record.exc_info[1]) == "a bug"  # type: ignore[index]
    assert (await client.get("/v2/health/live")).status_code == 200  # and the server goes on
