"""OpenAPI description of the inference body, which no pydantic model parses."""

from __future__ import annotations

from typing import Any, Final

from batchserve.core.datatypes import BY_WIRE

_PARAMETERS: Final[dict[str, Any]] = {"type": "object", "additionalProperties": True}

_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": list(BY_WIRE)},
        "parameters": _PARAMETERS,
        "data": {"description": "Tensor elements, flat or nested in row-major order."},
    },
}

_OUTPUT: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
}

INFER_REQUEST_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": _INPUT},
        "outputs": {"type": "array", "items": _OUTPUT},
    },
}

INFER_OPENAPI: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": INFER_REQUEST_SCHEMA},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "Binary tensor extension: a JSON header of "
                "Inference-Header-Content-Length bytes, then the tensors' bytes.",
            },
        },
    },
    "responses": {
        "200": {"description": "Inference result (JSON, or JSON header plus binary tensors)."},
        "400": {"description": 'Invalid request: {"error": message}.'},
        "404": {"description": "Unknown model or version."},
        "503": {"description": "Model not ready or queue full; retry after Retry-After."},
    },
}
