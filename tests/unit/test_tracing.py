"""Tracing off costs no OpenTelemetry SDK import on the request path: checked in a fresh
interpreter serving HTTP and gRPC requests through the real app, dataplane and batcher
(the spans themselves are tested end to end in tests/integration/test_tracing.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

UNIT = Path(__file__).resolve().parent
# Serves one HTTP and one gRPC request through the real app and dataplane (fake backend),
# tracing as the settings say, then reports which OpenTelemetry modules got imported.
SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, tempfile
    from pathlib import Path

    import httpx
    from batchserve.core.budgets import parse_budgets
    from batchserve.core.settings import Settings
    from batchserve.dataplane.plane import DataPlane
    from batchserve.grpc.servicer import InferenceServicer
    from batchserve.models.memory_probe import device_total_bytes
    from batchserve.models.registry import ModelRegistry
    from batchserve.models.repository import ModelRepository
    from batchserve.proto import grpc_service_pb2 as pb
    from batchserve.rest.app import build_http_app
    from batchserve.scheduler.memory import MemoryBudgets
    from fakes import FAKE_CONFIG, FakeBackend
    from onnx_models import FP32, build_model, write_model


    class Context:
        def peer(self): return "ipv4:127.0.0.1:1"
        def invocation_metadata(self): return ()
        def add_done_callback(self, callback): callback(self)


    async def main(root: Path, trace_config: list[str]) -> dict[str, object]:
        model = build_model([("x", FP32, ("N", 4))],
                            [("y", FP32, ("N", 4)), ("total", FP32, ("N", 1))])
        write_model(root / "fake" / "1" / "model.onnx", model)
        (root / "fake" / "config.pbtxt").write_text(FAKE_CONFIG)
        settings = Settings(model_repository=root, trace_config=tuple(trace_config))
        budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
        registry = ModelRegistry(ModelRepository(root), 8, budgets,
                                 lambda config, path: FakeBackend())
        dataplane = DataPlane(settings, registry, ["fake"])
        await registry.load("fake")
        transport = httpx.ASGITransport(app=build_http_app(dataplane, settings))
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                            "data": [1, 2, 3, 4]}]}
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answer = await client.post("/v2/models/fake/infer", json=body)
        request = pb.ModelInferRequest(model_name="fake")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1, 2, 3, 4])
        grpc_answer = await InferenceServicer(dataplane).ModelInfer(request, Context())
        await registry.close()
        return {"http": answer.status_code, "grpc": len(grpc_answer.outputs),
                "modules": sorted(m for m in sys.modules if m.startswith("opentelemetry."))}


    with tempfile.TemporaryDirectory() as root:
        print(json.dumps(asyncio.run(main(Path(root), sys.argv[1:]))))
    """
)


def _serve(*trace_config: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(UNIT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *trace_config],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_tracing_off_imports_no_opentelemetry_sdk_on_the_request_path() -> None:
    """FastAPI itself imports opentelemetry's API; the SDK and exporter stay out."""
    served = _serve()
    assert served["http"] == 200
    assert served["grpc"] == 2
    modules = served["modules"]
    assert isinstance(modules, list)
    assert not [m for m in modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]


def test_tracing_on_imports_the_sdk_when_a_request_is_traced() -> None:
    """The same script, traced: proves the check above would see the SDK if it came in."""
    served = _serve("level=TIMESTAMPS", "rate=1", "opentelemetry,url=127.0.0.1:9/v1/traces")
    assert served["http"] == 200
    assert served["grpc"] == 2
    modules = served["modules"]
    assert isinstance(modules, list)
    assert "opentelemetry.sdk.trace" in modules
