"""Triton's shared-memory routes (``src/http_server.cc``): register, unregister and status of
system (``/v2/systemsharedmemory``) and CUDA (``/v2/cudasharedmemory``) regions.

Register and unregister answer 200 with an empty body, status a JSON array, as Triton.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from batchserve.core.errors import InvalidArgument, PayloadTooLarge
from batchserve.core.tensors import describe
from batchserve.dataplane.plane import DataPlane
from batchserve.dataplane.shared_memory.clients import ClientRegions
from batchserve.dataplane.shared_memory.manager import RegionStatus
from batchserve.rest.bodies import read_limited

MAX_BODY: Final = 64 * 1024  # a register request is a few short fields
MAX_UINT64: Final = 2**64 - 1
SYSTEM: Final = "/v2/systemsharedmemory"
CUDA: Final = "/v2/cudasharedmemory"


def _json(content: Any) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")


def _empty() -> Response:
    return Response(b"", media_type="application/json")


def _register_too_large(size: str, limit: int) -> PayloadTooLarge:
    """A register request past MAX_BODY, a fixed bound no flag changes."""
    return PayloadTooLarge(
        f"shared memory register request of {size} bytes is over the limit of {limit} bytes"
    )


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of a register request, read no further than MAX_BODY bytes."""
    body = await read_limited(request, MAX_BODY, _register_too_large)
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as error:
        raise InvalidArgument(f"malformed JSON: {error}") from None
    if type(doc) is not dict:
        raise InvalidArgument(
            f"shared memory register request must be a JSON object, got {describe(doc)}"
        )
    return doc


def _uint(doc: dict[str, Any], key: str, *, required: bool) -> int:
    if key not in doc:
        if required:
            raise InvalidArgument(f"Shared memory register request has no '{key}' field")
        return 0
    value = doc[key]
    if type(value) is not int or not 0 <= value <= MAX_UINT64:
        raise InvalidArgument(
            f"Shared memory register request: '{key}' must be an integer >= 0, "
            f"got {describe(value)}"
        )
    return value


def _key(doc: dict[str, Any]) -> str:
    if "key" not in doc:
        raise InvalidArgument("Shared memory register request has no 'key' field")
    key = doc["key"]
    if type(key) is not str:
        raise InvalidArgument(
            f"Shared memory register request: 'key' must be a string, got {describe(key)}"
        )
    return key


def _raw_handle(doc: dict[str, Any]) -> bytes:
    """``{"raw_handle": {"b64": "..."}}``, decoded."""
    if "raw_handle" not in doc:
        raise InvalidArgument("Shared memory register request has no 'raw_handle' field")
    value = doc["raw_handle"]
    text = value.get("b64") if type(value) is dict else None
    if type(text) is not str:
        raise InvalidArgument(
            "Shared memory register request: 'raw_handle' must be {\"b64\": base64 string}"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
        ) from None


def _system_row(row: RegionStatus) -> dict[str, Any]:
    return {"name": row.name, "key": row.key, "offset": row.offset, "byte_size": row.byte_size}


def _cuda_row(row: RegionStatus) -> dict[str, Any]:
    return {"name": row.name, "device_id": row.device_id, "byte_size": row.byte_size}


def add_shared_memory_routes(app: FastAPI, dataplane: DataPlane) -> None:
    """The twelve routes (status, register, unregister; one region or all; both kinds)."""
    _add_system_routes(app, dataplane.regions)
    _add_cuda_routes(app, dataplane.regions)


def _peer(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


def _add_system_routes(app: FastAPI, regions: ClientRegions) -> None:
    # without a name, register answers Triton's refusal and the others act on every region
    for prefix in (SYSTEM, SYSTEM + "/region/{name}"):

        @app.get(prefix + "/status", summary="System shared-memory regions (Triton extension)")
        async def system_status(request: Request, name: str = "") -> Response:
            rows = regions.status("system", name, _peer(request))
            return _json([_system_row(row) for row in rows])

        @app.post(prefix + "/register", summary="Register system shared memory")
        async def system_register(request: Request, name: str = "") -> Response:
            doc = await _body(request)
            key = _key(doc)
            offset = _uint(doc, "offset", required=False)
            byte_size = _uint(doc, "byte_size", required=True)
            regions.register_system(name, key, offset, byte_size, _peer(request))
            return _empty()

        @app.post(prefix + "/unregister", summary="Unregister system shared memory")
        async def system_unregister(request: Request, name: str = "") -> Response:
            regions.unregister("system", name, _peer(request))
            return _empty()


def _add_cuda_routes(app: FastAPI, regions: ClientRegions) -> None:
    for prefix in (CUDA, CUDA + "/region/{name}"):

        @app.get(prefix + "/status", summary="CUDA shared-memory regions (Triton extension)")
        async def cuda_status(request: Request, name: str = "") -> Response:
            rows = regions.status("cuda", name, _peer(request))
            return _json([_cuda_row(row) for row in rows])

        @app.post(prefix + "/register", summary="Register CUDA shared memory")
        async def cuda_register(request: Request, name: str = "") -> Response:
            doc = await _body(request)
            raw_handle = _raw_handle(doc)
            byte_size = _uint(doc, "byte_size", required=True)
            device_id = _uint(doc, "device_id", required=True)
            regions.register_cuda(name, raw_handle, device_id, byte_size, _peer(request))
            return _empty()

        @app.post(prefix + "/unregister", summary="Unregister CUDA shared memory")
        async def cuda_unregister(request: Request, name: str = "") -> Response:
            regions.unregister("cuda", name, _peer(request))
            return _empty()
