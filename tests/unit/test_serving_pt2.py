"""A bare model.pt2 served through the whole stack: repository, registry, batcher, REST."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from batchserve.core.budgets import parse_budgets  # noqa: E402
from batchserve.core.settings import Settings  # noqa: E402
from batchserve.dataplane.plane import DataPlane  # noqa: E402
from batchserve.models.measured_defaults import ONE_POOL  # noqa: E402
from batchserve.models.memory_probe import device_total_bytes  # noqa: E402
from batchserve.models.registry import ModelRegistry  # noqa: E402
from batchserve.models.repository import ModelRepository  # noqa: E402
from batchserve.rest.app import build_http_app  # noqa: E402
from batchserve.scheduler.memory import MemoryBudgets  # noqa: E402
from pt2_models import ROW, Mlp, save_program  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """No config.pbtxt: everything is completed from the program, and the default factory
    (create_backend) picks the PyTorch backend from the file."""
    save_program(tmp_path / "mlp" / "1" / "model.pt2", Mlp(), (torch.randn(3, ROW),))
    settings = Settings(model_repository=tmp_path)
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    registry = ModelRegistry(ModelRepository(tmp_path), 64, budgets)
    await registry.load("mlp")
    app = build_http_app(DataPlane(settings, registry, ["mlp"]), settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    await registry.close()


def _request(x: np.ndarray) -> dict[str, object]:
    data = x.reshape(-1).tolist()
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": data}]}


async def test_the_config_is_completed_from_the_program(client: httpx.AsyncClient) -> None:
    config = (await client.get("/v2/models/mlp/config")).json()
    assert (config["platform"], config["backend"]) == ("torch_export", "pytorch")
    assert config["max_batch_size"] == 32
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [ROW])
    ]
    assert [t["name"] for t in config["output"]] == ["y", "hidden"]


async def test_concurrent_requests_are_batched_and_each_answer_matches_eager(
    client: httpx.AsyncClient,
) -> None:
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((rows, ROW)).astype(np.float32) for rows in (1, 2, 3, 1, 4)]
    responses = await asyncio.gather(
        *(client.post("/v2/models/mlp/infer", json=_request(x)) for x in requests)
    )
    module = Mlp().eval()
    for x, response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        with torch.no_grad():
            want = module(torch.from_numpy(x))
        for name in ("y", "hidden"):
            assert outputs[name]["shape"] == [len(x), 4]
            got = np.asarray(outputs[name]["data"], np.float32).reshape(len(x), 4)
            np.testing.assert_allclose(got, want[name].numpy(), rtol=1e-5, atol=1e-6)


async def test_a_wrong_shape_is_a_400_naming_the_input(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/mlp/infer", json=_request(np.ones((1, 3), "f4")))
    assert response.status_code == 400
    assert "'x'" in response.json()["error"]


async def test_on_a_cpu_its_instances_are_not_measured_as_torch_has_one_thread_pool(
    client: httpx.AsyncClient,
) -> None:
    (model,) = (await client.get("/v2/models/mlp/stats")).json()["model_stats"]
    measured = model["batchserve"]["measured_defaults"]
    assert measured["reason"] == ONE_POOL
    assert measured["measured"] == []
    assert (measured["chosen"]["instances"], measured["chosen"]["threads"]) == (1, 0)
    config = (await client.get("/v2/models/mlp/config")).json()
    assert "intra_op_thread_count" not in config.get("parameters", {})
