"""The HTTP application: FastAPI for every route, a raw handler in front for inference.

Routes follow the KServe v2 REST protocol and Triton's extensions (model configuration,
statistics, repository). Error bodies are ``{"error": message}``.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from batchserve import __version__
from batchserve.core.errors import BatchserveError, InvalidArgument, Unavailable
from batchserve.core.settings import Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.observability.trace_settings import json_updates as trace_updates
from batchserve.rest import responses
from batchserve.rest.bodies import json_object, read_limited
from batchserve.rest.errors import (
    UnexpectedErrors,
    handle_batchserve_error,
    handle_client_disconnect,
    handle_http_exception,
    handle_validation_error,
)
from batchserve.rest.generate import add_generate_routes
from batchserve.rest.infer import ASGIApp, InferEndpoint, Receive, Scope, Send, in_front_of
from batchserve.rest.openapi import INFER_OPENAPI
from batchserve.rest.restricted import restricted
from batchserve.rest.shared_memory import add_shared_memory_routes


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _add_health_routes(app: FastAPI, dataplane: DataPlane) -> None:
    @app.get("/v2/health/live", summary="Server liveness")
    async def live() -> Response:
        return _json({"live": True})

    @app.get("/v2/health/ready", summary="Server readiness: every model it serves is ready")
    async def ready() -> Response:
        if not dataplane.ready():
            raise Unavailable("server is not ready")
        return _json({"ready": True})

    @app.get("/v2", summary="Server metadata")
    async def server_metadata() -> Response:
        return _json(responses.server_metadata(dataplane.server_metadata()))


class _Delegate(Response):
    """Hands the untouched request to the raw inference handler."""

    def __init__(self, endpoint: InferEndpoint) -> None:
        super().__init__()
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.endpoint(scope, receive, send)


def _add_model_routes(app: FastAPI, dataplane: DataPlane, endpoint: InferEndpoint) -> None:
    @app.get("/v2/models/stats", summary="Statistics of every served model")
    async def all_stats() -> Response:
        return _json(responses.statistics(dataplane.model_statistics()))

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):

        @app.get(prefix, summary="Model metadata")
        async def metadata(name: str, version: str = "") -> Response:
            return _json(responses.model_metadata(dataplane.model_metadata(name, version)))

        @app.get(prefix + "/ready", summary="Model readiness")
        async def model_ready(name: str, version: str = "") -> Response:
            if not dataplane.model_ready(name, version):
                raise Unavailable(f"model '{name}' is not ready")
            return _json({"name": name, "ready": True})

        @app.get(prefix + "/config", summary="Model configuration (Triton extension)")
        async def config(name: str, version: str = "") -> Response:
            return _json(responses.message_json(dataplane.model_config(name, version)))

        @app.get(prefix + "/stats", summary="Model statistics (Triton extension)")
        async def stats(name: str, version: str = "") -> Response:
            return _json(responses.statistics(dataplane.model_statistics(name, version)))

        @app.post(prefix + "/infer", summary="Inference", openapi_extra=INFER_OPENAPI)
        async def infer(name: str, version: str = "") -> Response:
            # Normally answered in front of the framework; this keeps the route whole.
            return _Delegate(endpoint)


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    return parameters


def _ready_flag(body: bytes) -> bool:
    """The optional ``{"ready": bool}`` body of the index request."""
    ready = json_object(body).get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("Invalid value for 'ready': expected a boolean")
    return ready


def _add_repository_routes(app: FastAPI, dataplane: DataPlane) -> None:
    limit = dataplane.settings.max_binary_body_bytes
    control = dataplane.control

    @app.post("/v2/repository/index", summary="Repository index")
    async def index(request: Request, authorization: str | None = Header(None)) -> Response:
        control.check_token(authorization)  # before reading the body
        body = await read_limited(request, dataplane.settings.max_json_body_bytes)
        rows = control.repository_index(authorization, _ready_flag(body))
        return _json(responses.repository_index(rows))

    @app.post("/v2/repository/models/{name}/load", summary="Load or reload a model")
    async def load(
        name: str, request: Request, authorization: str | None = Header(None)
    ) -> Response:
        control.check_control(authorization)  # before reading up to 64 MiB
        parameters = _parameters(json_object(await read_limited(request, limit)))
        await control.repository_load(name, authorization, parameters, files_in_base64=True)
        return _json({})

    @app.post("/v2/repository/models/{name}/unload", summary="Unload a model")
    async def unload(
        name: str, request: Request, authorization: str | None = Header(None)
    ) -> Response:
        control.check_control(authorization)  # before reading the body
        body = await read_limited(request, dataplane.settings.max_json_body_bytes)
        parameters = _parameters(json_object(body))
        await control.repository_unload(name, authorization, parameters)
        return _json({})


def _add_settings_routes(app: FastAPI, dataplane: DataPlane) -> None:
    """Triton's trace and log settings: GET reads, POST updates and answers the result."""
    limit = dataplane.settings.max_json_body_bytes
    control = dataplane.control

    async def trace(name: str, request: Request, authorization: str | None) -> Response:
        updates = None
        if request.method == "POST":
            control.check_token(authorization)  # before reading the body
            updates = trace_updates(json_object(await read_limited(request, limit)))
        return _json(control.trace_settings(name, authorization, updates))

    @app.api_route("/v2/trace/setting", methods=["GET", "POST"], summary="Trace settings")
    async def global_trace(request: Request, authorization: str | None = Header(None)) -> Response:
        return await trace("", request, authorization)

    @app.api_route(
        "/v2/models/{name}/trace/setting",
        methods=["GET", "POST"],
        summary="A model's trace settings",
    )
    async def model_trace(
        name: str, request: Request, authorization: str | None = Header(None)
    ) -> Response:
        return await trace(name, request, authorization)

    @app.get("/v2/logging", summary="Log settings (Triton extension)")
    async def get_logging() -> Response:
        return _json(control.log_settings(None))

    @app.post("/v2/logging", summary="Update log settings (Triton extension)")
    async def update_logging(
        request: Request, authorization: str | None = Header(None)
    ) -> Response:
        control.check_token(authorization)  # before reading the body
        updates = json_object(await read_limited(request, limit))
        return _json(control.log_settings(authorization, updates))


def build_fastapi(dataplane: DataPlane, endpoint: InferEndpoint) -> FastAPI:
    """Every route, declared for the OpenAPI document; errors in the protocol's shape."""
    app = FastAPI(title="batchserve", version=__version__, docs_url=None, redoc_url=None)
    app.add_exception_handler(BatchserveError, handle_batchserve_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(HTTPException, handle_http_exception)
    app.add_exception_handler(ClientDisconnect, handle_client_disconnect)
    app.add_middleware(UnexpectedErrors)  # what no handler above takes
    _add_health_routes(app, dataplane)
    _add_model_routes(app, dataplane, endpoint)
    _add_repository_routes(app, dataplane)
    _add_settings_routes(app, dataplane)
    add_shared_memory_routes(app, dataplane)
    add_generate_routes(app, dataplane, dataplane.settings)
    return app


def build_http_app(dataplane: DataPlane, settings: Settings) -> ASGIApp:
    """The ASGI application uvicorn serves."""
    endpoint = InferEndpoint(dataplane, settings)
    app = in_front_of(endpoint, build_fastapi(dataplane, endpoint))
    return restricted(app, settings.http_restrictions())
