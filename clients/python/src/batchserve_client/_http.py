"""The KServe v2 REST protocol: every call as a request, and how to read its answer.

Inference uses Triton's binary tensor extension by default: the body is a JSON header
of ``Inference-Header-Content-Length`` bytes followed by each input's raw bytes (its
``binary_data_size``), and ``binary_data_output`` asks for the outputs the same way.
No I/O happens here.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import quote

import httpx

from batchserve_client import _json
from batchserve_client._call import Call
from batchserve_client._infer import InferRequest
from batchserve_client.errors import InvalidResponse, from_http_status
from batchserve_client.results import InferResult, ModelMetadata, ServerMetadata, TensorMetadata
from batchserve_client.retry import Retry
from batchserve_client.tensors import Array, from_bytes, from_json, to_bytes, to_json

T = TypeVar("T")
HEADER_LENGTH: Final = "Inference-Header-Content-Length"


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


HttpCall = Call[HttpRequest, httpx.Response, T]


class HttpApi:
    """The calls of the REST protocol (``binary_data``: tensors as binary, not JSON)."""

    def __init__(self, *, binary_data: bool = True) -> None:
        self._binary = binary_data

    def is_live(self) -> HttpCall[bool]:
        return _probe("/v2/health/live")

    def is_ready(self) -> HttpCall[bool]:
        return _probe("/v2/health/ready")

    def is_model_ready(self, model: str, version: str) -> HttpCall[bool]:
        return _probe(_model_path(model, version) + "/ready")

    def server_metadata(self) -> HttpCall[ServerMetadata]:
        return _get("/v2", _json_reader(_server_metadata))

    def model_metadata(self, model: str, version: str) -> HttpCall[ModelMetadata]:
        return _get(_model_path(model, version), _json_reader(_model_metadata))

    def model_config(self, model: str, version: str) -> HttpCall[dict[str, Any]]:
        return _get(_model_path(model, version) + "/config", _json_reader(_object))

    def model_statistics(self, model: str, version: str) -> HttpCall[list[dict[str, Any]]]:
        path = (_model_path(model, version) if model else "/v2/models") + "/stats"
        return _get(path, _json_reader(lambda doc: _list(_object(doc)["model_stats"])))

    def repository_index(self, ready: bool) -> HttpCall[list[dict[str, Any]]]:
        request = HttpRequest("POST", "/v2/repository/index", _json.dumps({"ready": ready}))
        return Call(request, _json_reader(_list), Retry.IDEMPOTENT)

    def load_model(self, model: str) -> HttpCall[None]:
        return _control(model, "load")

    def unload_model(self, model: str) -> HttpCall[None]:
        return _control(model, "unload")

    def infer(self, request: InferRequest) -> HttpCall[InferResult]:
        content, headers = encode_infer(request, binary=self._binary)
        path = _model_path(request.model, request.version) + "/infer"
        return Call(HttpRequest("POST", path, content, headers), read_infer, Retry.UNAVAILABLE)


def _model_path(model: str, version: str) -> str:
    path = "/v2/models/" + quote(model, safe="")
    return path + "/versions/" + quote(version, safe="") if version else path


def _probe(path: str) -> HttpCall[bool]:
    """Health is the status itself: 200 is yes, any other answer no."""
    return Call(HttpRequest("GET", path), lambda response: response.status_code == 200, Retry.NEVER)


def _get(path: str, read: Callable[[httpx.Response], T]) -> HttpCall[T]:
    return Call(HttpRequest("GET", path), read, Retry.IDEMPOTENT)


def _control(model: str, action: str) -> HttpCall[None]:
    path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
    return Call(HttpRequest("POST", path), _json_reader(lambda _: None), Retry.UNAVAILABLE)


def raise_for_status(response: httpx.Response) -> None:
    """The library's error for an error status, with the server's message."""
    if response.status_code < 400:
        return
    raise from_http_status(
        response.status_code, _error_message(response), retry_after(response.headers)
    )


def _error_message(response: httpx.Response) -> str:
    try:
        message = _json.loads(response.content)["error"]
    except (ValueError, TypeError, KeyError):
        return response.text[:500] or response.reason_phrase
    return str(message)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _json_reader(convert: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    def read(response: httpx.Response) -> T:
        raise_for_status(response)
        try:
            return convert(_json.loads(response.content))
        except (ValueError, TypeError, KeyError) as error:
            raise InvalidResponse(f"unexpected answer from {response.url}: {error!r}") from None

    return read


def _object(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _list(doc: Any) -> list[Any]:
    if not isinstance(doc, list):
        raise TypeError(f"expected a JSON array, got {type(doc).__name__}")
    return doc


def _server_metadata(doc: Any) -> ServerMetadata:
    return ServerMetadata(doc["name"], doc["version"], tuple(doc.get("extensions", ())))


def _tensor_metadata(doc: Any) -> TensorMetadata:
    return TensorMetadata(doc["name"], doc["datatype"], tuple(int(d) for d in doc["shape"]))


def _model_metadata(doc: Any) -> ModelMetadata:
    return ModelMetadata(
        name=doc["name"],
        versions=tuple(doc.get("versions", ())),
        platform=doc.get("platform", ""),
        inputs=tuple(_tensor_metadata(t) for t in doc.get("inputs", ())),
        outputs=tuple(_tensor_metadata(t) for t in doc.get("outputs", ())),
    )


def encode_infer(request: InferRequest, *, binary: bool) -> tuple[bytes, dict[str, str]]:
    """The body and headers of an inference: JSON, then the inputs' bytes when binary."""
    chunks: list[bytes] = []
    inputs = []
    for tensor in request.inputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.array.shape),
        }
        if binary:
            chunks.append(to_bytes(tensor.array, tensor.datatype))
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = to_json(tensor.array, tensor.datatype, name=tensor.name)
        inputs.append(entry)
    header = _json.dumps(_infer_document(request, inputs, binary))
    if not binary:
        return header, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return b"".join([header, *chunks]), headers


def _infer_document(
    request: InferRequest, inputs: list[dict[str, Any]], binary: bool
) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    parameters = {**request.parameters, **({"binary_data_output": True} if binary else {})}
    if parameters:
        doc["parameters"] = parameters
    if request.outputs:
        doc["outputs"] = [{"name": name} for name in request.outputs]
    return doc


def read_infer(response: httpx.Response) -> InferResult:
    """The outputs of an inference answer, binary ones as views of the body."""
    raise_for_status(response)
    body = memoryview(response.content)
    length = response.headers.get(HEADER_LENGTH)
    try:
        json_end = len(body) if length is None else int(length)
        return _infer_result(_json.loads(body[:json_end]), body[json_end:])
    except (ValueError, TypeError, KeyError) as error:
        raise InvalidResponse(f"unexpected inference answer: {error!r}") from None


def _infer_result(doc: dict[str, Any], binary: memoryview) -> InferResult:
    outputs: dict[str, Array] = {}
    offset = 0
    for output in doc["outputs"]:
        shape, datatype = tuple(output["shape"]), output["datatype"]
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            outputs[output["name"]] = from_json(output["data"], datatype, shape)
            continue
        if offset + size > len(binary):
            raise InvalidResponse(f"output '{output['name']}' runs past the end of the body")
        outputs[output["name"]] = from_bytes(binary[offset : offset + size], datatype, shape)
        offset += size
    return InferResult(
        outputs,
        model_name=doc["model_name"],
        model_version=doc.get("model_version", ""),
        id=doc.get("id", ""),
        parameters=doc.get("parameters", {}),
    )
