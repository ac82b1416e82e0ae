"""Repository control and settings routes in-process: real dataplane and registry over a
fake backend, explicit model control with a token."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.models import placing
from batchserve.models.registry import ModelRegistry
from batchserve.rest.app import build_http_app
from fakes import FakeBackend

from tests.unit.rest.test_rest_app import _budgets, _repository

pytestmark = pytest.mark.anyio
AUTH = {"Authorization": "Bearer t0ken"}


@pytest.fixture
async def client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    repo = tmp_path / "repo"
    settings = Settings(
        model_repository=repo,
        model_control_mode=ModelControlMode.EXPLICIT,
        control_token="t0ken",
        max_binary_body_bytes=1_000_000,
    )
    repo.mkdir()
    registry = ModelRegistry(_repository(repo), 8, _budgets(), lambda config, path: FakeBackend())
    dataplane = DataPlane(settings, registry, [])
    await registry.load("fake")
    transport = httpx.ASGITransport(app=build_http_app(dataplane, settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await registry.close()


async def _config(client: httpx.AsyncClient, name: str) -> dict[str, object]:
    response = await client.get(f"/v2/models/{name}/config")
    assert response.status_code == 200, response.text
    config: dict[str, object] = response.json()
    return config


async def test_a_config_override_lasts_until_a_plain_load(client: httpx.AsyncClient) -> None:
    body = {"parameters": {"config": '{"max_batch_size": 2}'}}
    response = await client.post("/v2/repository/models/fake/load", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert (await _config(client, "fake"))["max_batch_size"] == 2
    await client.post("/v2/repository/models/fake/load", headers=AUTH)
    assert (await _config(client, "fake"))["max_batch_size"] == 8


async def test_files_load_a_model_from_a_private_directory_removed_on_unload(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    onnx = (tmp_path / "repo/fake/1/model.onnx").read_bytes()
    parameters = {
        "config": '{"max_batch_size": 4}',
        "file:1/model.onnx": base64.b64encode(onnx).decode(),
    }
    url = "/v2/repository/models/copy/load"
    response = await client.post(url, json={"parameters": parameters}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert (await _config(client, "copy"))["max_batch_size"] == 4
    assert [p.name[:16] for p in (tmp_path / "tmp").iterdir()] == ["batchserve-load-"]
    unload = {"parameters": {"unload_dependents": False}}
    response = await client.post("/v2/repository/models/copy/unload", json=unload, headers=AUTH)
    assert response.status_code == 200, response.text
    assert list((tmp_path / "tmp").iterdir()) == []


async def test_a_failed_load_from_files_leaves_nothing_behind(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    parameters = {"config": "{}", "file:2/model.onnx": base64.b64encode(b"junk").decode()}
    url = "/v2/repository/models/fake/load"
    response = await client.post(url, json={"parameters": parameters}, headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"].startswith("load failed for model 'fake': ")  # Triton's
    assert list((tmp_path / "tmp").iterdir()) == []
    assert (await client.get("/v2/models/fake/ready")).status_code == 200


async def test_load_parameters_need_the_token_before_they_are_read(
    client: httpx.AsyncClient,
) -> None:
    body = {"parameters": {"nonsense": 1}}
    response = await client.post("/v2/repository/models/fake/load", json=body)
    assert response.status_code == 401


async def test_settings_updates_need_the_token(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v2/trace/setting", json={"trace_rate": "5"})).status_code == 401
    answer = await client.post("/v2/trace/setting", json={"trace_rate": "5"}, headers=AUTH)
    assert answer.json()["trace_rate"] == "5"
    assert (await client.get("/v2/models/fake/trace/setting")).json()["trace_rate"] == "5"
    assert (await client.post("/v2/logging", json={"log_info": True})).status_code == 401


async def test_a_model_that_cannot_load_its_instances_gets_tritons_load_failed_text(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's lifecycle tests look for "load failed for model 'm'" when a model that was
    read fails to load (its instances, its runtime); "failed to load 'm', failed to poll" is
    for a repository or request at fault."""
    monkeypatch.setattr(placing, "gpu_count", lambda: 0)
    body = {"parameters": {"config": '{"instance_group": [{"kind": "KIND_GPU", "count": 1}]}'}}
    response = await client.post("/v2/repository/models/fake/load", json=body, headers=AUTH)
    assert response.status_code >= 400
    error = response.json()["error"]
    assert error.startswith("load failed for model 'fake': "), error
    assert "asks for a GPU" in error
    assert (await client.get("/v2/models/fake/ready")).status_code == 200
