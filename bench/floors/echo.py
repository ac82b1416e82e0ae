"""The echo model shared by the HTTP floors: metadata, config, statistics, one infer."""

from __future__ import annotations

import json
from typing import Any

MODEL = "identity"
WIDTH = 16
PREFIX = f"/v2/models/{MODEL}"
INFER_PATH = f"{PREFIX}/infer"
HEADER_LENGTH = "Inference-Header-Content-Length"
_TENSOR = {"datatype": "FP32", "shape": [-1, WIDTH]}
METADATA = {
    "name": MODEL, "versions": ["1"], "platform": "echo",
    "inputs": [{"name": "INPUT__0", **_TENSOR}], "outputs": [{"name": "OUTPUT__0", **_TENSOR}],
}  # fmt: skip
CONFIG = {
    "name": MODEL, "platform": "", "backend": "echo", "max_batch_size": 64,
    "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
    "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
}  # fmt: skip
SERVER = {"name": "echo", "version": "0", "extensions": ["binary_tensor_data"]}


class Echo:
    """Answers each infer with its own input, as binary tensor data; counts requests."""

    def __init__(self) -> None:
        self.count = 0

    def infer(self, body: bytes, header_length: int) -> tuple[bytes, int]:
        """(response body, length of its JSON header) for a binary-extension request."""
        header = json.loads(body[:header_length])
        raw = body[header_length:]
        self.count += 1
        output = {"name": "OUTPUT__0", "datatype": "FP32", "shape": header["inputs"][0]["shape"],
                  "parameters": {"binary_data_size": len(raw)}}  # fmt: skip
        answer: dict[str, Any] = {"model_name": MODEL, "model_version": "1", "outputs": [output]}
        if "id" in header:
            answer["id"] = header["id"]
        encoded = json.dumps(answer).encode()
        return encoded + raw, len(encoded)

    def statistics(self) -> bytes:
        """Triton-style statistics: every request is its own execution."""
        stats = {"name": MODEL, "version": "1", "last_inference": 0,
                 "inference_count": self.count, "execution_count": self.count,
                 "inference_stats": {}, "batch_stats": []}  # fmt: skip
        return json.dumps({"model_stats": [stats]}).encode()

    def get_routes(self) -> dict[str, bytes | None]:
        """Body of each GET path; None means the live statistics."""
        return {
            "/v2/health/live": b"", "/v2/health/ready": b"", "/v2": json.dumps(SERVER).encode(),
            PREFIX: json.dumps(METADATA).encode(), f"{PREFIX}/ready": b"",
            f"{PREFIX}/config": json.dumps(CONFIG).encode(), f"{PREFIX}/stats": None,
        }  # fmt: skip
