"""What the examples check, once: the add/sub answer, the inputs they send, the deadlines."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

TIMEOUT = 10.0
"""Seconds any one client call may take: a broken feature fails a test, never hangs it."""

INPUT0 = np.arange(16, dtype=np.int32)[np.newaxis]
ONES = np.ones(shape=(1, 16), dtype=np.int32)
MINUS_ONES = np.full(shape=(1, 16), fill_value=-1, dtype=np.int32)


def http_client(url: str, **kwargs: object) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        url=url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT, **kwargs
    )


def grpc_client(url: str, **kwargs: object) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=url, **kwargs)


def assert_add_sub(
    input0: np.ndarray, input1: np.ndarray, output0: np.ndarray, output1: np.ndarray
) -> None:
    """The examples' loop: output0[0][i] is the sum, output1[0][i] the difference."""
    for i in range(16):
        assert input0[0][i] + input1[0][i] == output0[0][i], f"incorrect sum at {i}: {output0}"
        assert input0[0][i] - input1[0][i] == output1[0][i], (
            f"incorrect difference at {i}: {output1}"
        )


def strings(values: np.ndarray) -> np.ndarray:
    """The string examples' encoding: each integer as its decimal text, UTF-8, object array."""
    flat = [str(x).encode("utf-8") for x in values.reshape(values.size)]
    return np.array(flat, dtype=np.object_).reshape(values.shape)


def identity_data(kind: str) -> np.ndarray:
    """The string examples' identity inputs: UTF-8 text with a NUL inside (object array),
    or non-text bytes (a fixed-width ``np.bytes_`` array), [1, 16] each."""
    if kind == "null_chars":
        return np.array([b"he\x00llo" for _ in range(16)], dtype=np.object_).reshape(1, 16)
    return np.array([b"\x00\x01\x02\x03" for _ in range(16)], dtype=np.bytes_).reshape(1, 16)
