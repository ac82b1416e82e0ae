"""JSON with orjson when it is installed (several times faster), else the standard library."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:
    orjson = None  # type: ignore[assignment]


def dumps(value: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, separators=(",", ":")).encode()


def loads(data: bytes | memoryview) -> Any:
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(bytes(data))
