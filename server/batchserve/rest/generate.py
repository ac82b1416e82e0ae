"""Triton's generate extension: ``POST /v2/models/<m>[/versions/<v>]/generate`` and
``generate_stream``, plain JSON in and out, for text generation clients.

Each top-level key of the request that names a model input becomes that input (its
datatype and shape from the model's metadata: a scalar is one element; fixed dims divide
the elements, the innermost variable dim takes the rest and the others are 1); ``id`` is
the request id; ``parameters`` is a nested object read the same way; any other key is a
request parameter. A response is one JSON object: ``model_name``, ``model_version``, ``id``
when set, and each output (one element as a bare value, more as a flat list).
``generate_stream`` sends each response of a decoupled model (or of repeat or square without
``decoupled: true``: Triton's generate endpoints ignore the policy) as a server-sent event
(``data: {...}``) as it comes, and an error after the first as ``data: {"error": ...}``;
``generate`` answers the one response the request gets, as Triton does, and a request to a
model that may answer many times asks it for one (``streaming=False``).

Both are traced as inference requests are (``--trace-config``): the body read, the request
built, the model's answer (a stream's last response), encoded and sent.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument, public_message
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, InferResponse, Tensor, request_options
from batchserve.dataplane.plane import DataPlane
from batchserve.observability.request_trace import RequestTrace
from batchserve.rest.bodies import json_object, read_limited
from batchserve.rest.disconnect import until_disconnect
from batchserve.rest.json_tensors import check_json_values

EVENT_STREAM = "text/event-stream; charset=utf-8"
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)


def add_generate_routes(app: FastAPI, dataplane: DataPlane, settings: Settings) -> None:
    endpoints = _GenerateEndpoints(dataplane, settings.max_json_body_bytes)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):

        @app.post(f"{prefix}/generate", summary="Generate (one response)")
        async def generate(name: str, request: Request, version: str = "") -> Response:
            return await endpoints.generate(request, name, version)

        @app.post(f"{prefix}/generate_stream", summary="Generate (server-sent events)")
        async def generate_stream(name: str, request: Request, version: str = "") -> Response:
            return await endpoints.generate_stream(request, name, version)


class _GenerateEndpoints:
    """The two endpoints' work, each request traced where the trace settings sample it."""

    def __init__(self, dataplane: DataPlane, limit: int) -> None:
        self.dataplane = dataplane
        self.limit = limit

    async def generate(self, http: Request, name: str, version: str) -> Response:
        trace = self._begin(http, name)
        try:
            infer = await self._request(http, name, version, trace)
            replies = _two_at_most(self.dataplane, infer)
            answers = await until_disconnect(replies, http.receive)
            if len(answers) != 1:
                raise InvalidArgument(ONE_RESPONSE)
            if trace is not None:
                _answered(trace, answers[0])
            body = response_json(answers[0])
        except BaseException as exc:
            if trace is not None:
                _ended(trace, exc)
            raise
        if trace is None:
            return Response(body, media_type="application/json")
        trace.mark("encode")  # sent, and the trace written, once the body is out
        return Response(
            body, media_type="application/json", background=BackgroundTask(_sent, trace)
        )

    async def generate_stream(self, http: Request, name: str, version: str) -> Response:
        trace = self._begin(http, name)
        try:
            infer = await self._request(http, name, version, trace)
        except BaseException as exc:
            if trace is not None:
                _ended(trace, exc)
            raise
        responses = self.dataplane.respond(infer, streaming=True, every=True)
        try:  # an error before the first response is an HTTP error
            first = await until_disconnect(anext(responses), http.receive)
        except StopAsyncIteration:
            if trace is not None:  # answered with no response at all
                trace.mark("infer")
                trace.mark("encode")
                _sent(trace)
            return StreamingResponse(iter(()), media_type=EVENT_STREAM)
        except BaseException as exc:
            await responses.aclose()
            if trace is not None:
                _ended(trace, exc)
            raise
        return StreamingResponse(_events(first, responses, trace), media_type=EVENT_STREAM)

    def _begin(self, http: Request, name: str) -> RequestTrace | None:
        if not self.dataplane.tracing.on:
            return None
        return self.dataplane.tracing.begin("http", name, http.headers.get)

    async def _request(
        self, http: Request, name: str, version: str, trace: RequestTrace | None
    ) -> InferRequest:
        body = json_object(await read_limited(http, self.limit))
        if trace is not None:
            trace.mark("receive")
        infer = generate_request(self.dataplane, body, name, version)
        if trace is not None:
            trace.mark("decode")
            trace.decoded(infer)
        return infer


def _answered(trace: RequestTrace, response: InferResponse) -> None:
    trace.mark("infer")
    trace.answered(response)


def _ended(trace: RequestTrace, error: BaseException) -> None:
    """A traced request that failed (or whose client left): written now."""
    if isinstance(error, Exception):
        trace.failed(error)
    trace.finish()


def _sent(trace: RequestTrace) -> None:
    trace.mark("send")
    trace.finish()


async def _two_at_most(dataplane: DataPlane, infer: InferRequest) -> list[InferResponse]:
    """The request's responses, stopping the model at a second (it may have millions more).
    Run until the client leaves (``until_disconnect``): a client gone before the first
    response used to leave the model answering nobody, and an unload waiting for it."""
    answers: list[InferResponse] = []
    async with contextlib.aclosing(
        dataplane.respond(infer, streaming=False, every=True)
    ) as replies:
        async for answer in replies:
            answers.append(answer)
            if len(answers) > 1:
                break
    return answers


async def _events(
    first: InferResponse, rest: AsyncIterator[InferResponse], trace: RequestTrace | None
) -> AsyncIterator[bytes]:
    """The responses as events; a trace's answer is the final response (the last sent,
    where the final flag came bare and was not sent), and it is sent once the transport
    has taken that response's event."""
    last = first
    try:
        yield _traced_event(first, trace)
        try:
            async for response in rest:
                last = response
                yield _traced_event(response, trace)
        except Exception as exc:  # the status is sent: the error goes in the stream
            if trace is not None:
                trace.failed(exc)
            yield _event(orjson.dumps({"error": public_message(exc)}))
            return
        if trace is not None and trace.response is None:
            _answered(trace, last)
            trace.mark("encode")
    finally:
        if trace is not None:
            if trace.error is None and trace.response is not None:
                _sent(trace)
            else:  # failed, or the client left before the final response
                trace.finish()


def _traced_event(response: InferResponse, trace: RequestTrace | None) -> bytes:
    if trace is None or not response.final:
        return _event(response_json(response))
    _answered(trace, response)
    event = _event(response_json(response))
    trace.mark("encode")
    return event


def _event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def generate_request(
    dataplane: DataPlane, body: dict[str, Any], name: str, version: str
) -> InferRequest:
    """The request a generate body stands for, against the model's metadata."""
    metadata = dataplane.model_metadata(name, version)
    inputs = {spec.name: spec for spec in metadata.inputs}
    if "parameters" in inputs:
        raise InvalidArgument(
            "Keyword 'parameters' for nested schema also given as input tensor name"
        )
    tensors: dict[str, Tensor] = {}
    parameters: dict[str, Any] = {}
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("'id' must be a string")
    nested = body.get("parameters", {})
    if not isinstance(nested, dict):
        raise InvalidArgument("Expected JSON object for keyword: 'parameters'")
    for key, value in [*body.items(), *nested.items()]:
        if key in ("id", "parameters"):
            continue
        spec = inputs.get(key)
        if spec is not None:
            tensors[key] = _tensor(key, spec.datatype, spec.shape, value)
        elif isinstance(value, bool | int | float | str):
            parameters[key] = value
        else:
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
    options = request_options(parameters)
    return InferRequest(
        model_name=name, model_version=version, id=request_id, inputs=list(tensors.values()),
        parameters=options.parameters, priority=options.priority,
        timeout_us=options.timeout_us, protocol="http", sequence=options.sequence,
    )  # fmt: skip


def _tensor(name: str, wire: str, dims: tuple[int, ...], value: object) -> Tensor:
    values: list[Any] = value if isinstance(value, list) else [value]
    datatype = BY_WIRE[wire]
    check_json_values(values, datatype, name)  # Triton's words for a value of the wrong type
    try:
        if wire == "BYTES":
            data = np.array([v.encode() for v in values], dtype=np.object_)
        elif wire == "BOOL":
            data = np.array(values, dtype=np.bool_)
        else:
            data = _numbers(name, wire, np.array(values), datatype.numpy)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"input '{name}': {exc}") from None
    shape = _shape(name, dims, data.size)
    return Tensor(name, datatype, shape, data.reshape(shape))


def _numbers(name: str, wire: str, array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """JSON numbers as ``dtype``: integers in its range for an integer type."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
            raise InvalidArgument(f"input '{name}': a value is outside the range of {wire}")
    return array.astype(dtype)


def _shape(name: str, dims: tuple[int, ...], count: int) -> tuple[int, ...]:
    """Triton's rule: fixed dims divide the count, the innermost variable dim takes the
    rest, any other variable dim is 1."""
    fixed = math.prod(d for d in dims if d >= 0)
    variable = [i for i, d in enumerate(dims) if d < 0]
    rest, remainder = divmod(count, fixed) if fixed else (0, count)
    if remainder or (not variable and rest != 1):
        raise InvalidArgument(
            f"The schema can not convert input '{name}' to tensor with proper shape"
        )
    shape = [max(d, 1) if d < 0 else d for d in dims]
    if variable:
        shape[variable[-1]] = rest
    return tuple(shape)


def response_json(response: InferResponse) -> bytes:
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    document.update(response.parameters)
    for tensor in response.outputs:
        values = [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            for v in tensor.data.reshape(-1).tolist()
        ]
        document[tensor.name] = values[0] if len(values) == 1 else values
    return orjson.dumps(document)
