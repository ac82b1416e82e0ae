"""Calls KServe's own Python SDK makes to a v2 server, run in a process of their own.

KServe's SDK and NVIDIA's tritonclient each register the v2 protocol's messages
(``inference.ModelInferRequest`` and the rest) under different file names, and protobuf's
one descriptor pool refuses the second. So ``test_kserve_sdk`` runs this module with
``python -m`` and reads one JSON object from its standard output: for every call, what was
sent and what came back (or the error the SDK raised), for the test to judge. The server's
addresses come on standard input as ``{"http": "http://host:port", "grpc": "host:port"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

DIGITS = "digits_cnn"
SIMPLE = "simple"
STRINGS = "simple_string"

Call = Callable[[], Awaitable[Any]]


def _digits(batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(batch, 1, 8, 8)).astype(np.float32)


def _pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.integers(-1000, 1000, size=(2, 16)).astype(np.int32)
    return values[0], values[1]


def _numpy_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> InferInput:
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _listed(array: np.ndarray) -> list[Any]:
    """An array as JSON: BYTES elements as text, everything else as numbers."""
    if array.dtype == np.object_:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    return array.reshape(-1).tolist()


def _sent(**arrays: np.ndarray) -> dict[str, Any]:
    return {name: {"shape": list(a.shape), "data": _listed(a)} for name, a in arrays.items()}


def _answer(response: Any) -> dict[str, Any]:
    outputs = {}
    for output in response.outputs:
        array = output.as_numpy()
        outputs[output.name] = {
            "datatype": output.datatype,
            "shape": list(array.shape),
            "data": _listed(array),
        }
    return {"id": response.id, "model_name": response.model_name, "outputs": outputs}


async def _record(call: Call) -> dict[str, Any]:
    """The call's result, or the error the SDK raised, in the form the test reads."""
    try:
        result = await call()
    except httpx.HTTPStatusError as error:
        return {"error": {"kind": "http", "status": error.response.status_code,
                          "message": str(error)}}  # fmt: skip
    except grpc.RpcError as error:
        code = error.code()
        return {"error": {"kind": "grpc", "status": code.name,
                          "message": error.details()}}  # fmt: skip
    return {"result": result}


def _strings() -> tuple[np.ndarray, np.ndarray]:
    first = np.array([str(v).encode() for v in range(16)], dtype=np.object_).reshape(1, 16)
    second = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    return first, second


async def _rest_calls(base: str) -> dict[str, Any]:
    calls: dict[str, Any] = {}
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        calls["live"] = await _record(lambda: client.is_server_live(base))
        calls["ready"] = await _record(lambda: client.is_server_ready(base))
        calls["model_ready"] = await _record(lambda: client.is_model_ready(base, DIGITS))
        calls["unknown_model_ready"] = await _record(
            lambda: client.is_model_ready(base, "no_such_model")
        )

        # JSON in and out; binary in, one output asked for as binary; JSON in, every
        # output binary by the request's binary_data_output parameter
        for name, batch, seed, binary, options in (
            ("digits_json", 3, 1, False, {"request_id": "rest-json"}),
            ("digits_binary", 2, 2, True, {
                "request_id": "rest-binary",
                "request_outputs": [RequestedOutput("probabilities", {"binary_data": True})]}),
            ("digits_binary_outputs", 2, 9, False, {
                "request_id": "rest-binary-outputs",
                "parameters": {"binary_data_output": True}}),
        ):  # fmt: skip
            image = _digits(batch, seed)
            request = InferRequest(
                DIGITS, [_numpy_input("image", image, "FP32", binary=binary)], **options
            )
            calls[name] = {"sent": _sent(image=image), **await _record(
                lambda request=request: _infer_rest(client, base, request))}  # fmt: skip

        a, b = _pair(seed=3)
        simple = InferRequest(
            SIMPLE,
            [_numpy_input("INPUT0", a[None], "INT32", binary=True),
             _numpy_input("INPUT1", b[None], "INT32", binary=True)],
        )  # fmt: skip
        calls["simple_binary"] = {"sent": _sent(INPUT0=a[None], INPUT1=b[None]), **await _record(
            lambda: _infer_rest(client, base, simple))}  # fmt: skip

        for binary in (False, True):
            first, second = _strings()
            strings = InferRequest(
                STRINGS,
                [_numpy_input("INPUT0", first, "BYTES", binary=binary),
                 _numpy_input("INPUT1", second, "BYTES", binary=binary)],
            )  # fmt: skip
            calls[f"strings_{'binary' if binary else 'json'}"] = {
                "sent": _sent(INPUT0=first, INPUT1=second),
                **await _record(lambda request=strings: _infer_rest(client, base, request)),
            }

        wrong = InferRequest(
            DIGITS, [_numpy_input("image", np.zeros((1, 1, 8, 7), np.float32), "FP32", True)]
        )
        calls["wrong_shape"] = await _record(lambda: _infer_rest(client, base, wrong))
        typed = InferRequest(
            DIGITS, [_numpy_input("image", np.zeros((1, 1, 8, 8), np.int32), "INT32", True)]
        )
        calls["wrong_datatype"] = await _record(lambda: _infer_rest(client, base, typed))
        unknown = InferRequest(
            "no_such_model", [_numpy_input("image", _digits(1, seed=4), "FP32", binary=True)]
        )
        calls["unknown_model"] = await _record(lambda: _infer_rest(client, base, unknown))
    finally:
        await client.close()
    return calls


async def _infer_rest(client: InferenceRESTClient, base: str, request: InferRequest) -> Any:
    headers: dict[str, str] = {}
    response = await client.infer(
        base, request, model_name=request.model_name, response_headers=headers
    )
    # The header that says where the JSON ends and binary outputs begin.
    return {**_answer(response), "binary_outputs": "inference-header-content-length" in headers}


async def _grpc_calls(url: str) -> dict[str, Any]:
    calls: dict[str, Any] = {}
    client = InferenceGRPCClient(url, retries=0, timeout=30)
    try:
        calls["live"] = await _record(client.is_server_live)
        calls["ready"] = await _record(client.is_server_ready)
        calls["model_ready"] = await _record(lambda: client.is_model_ready(DIGITS))
        calls["unknown_model_ready"] = await _record(lambda: client.is_model_ready("no_such_model"))

        image = _digits(3, seed=5)
        raw = InferRequest(
            DIGITS, [_numpy_input("image", image, "FP32", binary=True)], request_id="grpc-raw"
        )
        calls["digits_raw"] = {"sent": _sent(image=image), **await _record(
            lambda: _infer_grpc(client, raw))}  # fmt: skip

        image = _digits(2, seed=6)
        listed = InferRequest(
            DIGITS,
            [InferInput("image", list(image.shape), "FP32", data=image.reshape(-1).tolist())],
            request_id="grpc-contents",
        )
        calls["digits_contents"] = {"sent": _sent(image=image), **await _record(
            lambda: _infer_grpc(client, listed))}  # fmt: skip

        a, b = _pair(seed=7)
        simple = InferRequest(
            SIMPLE,
            [InferInput("INPUT0", [1, 16], "INT32", data=a.tolist()),
             InferInput("INPUT1", [1, 16], "INT32", data=b.tolist())],
        )  # fmt: skip
        calls["simple_contents"] = {"sent": _sent(INPUT0=a[None], INPUT1=b[None]), **await _record(
            lambda: _infer_grpc(client, simple))}  # fmt: skip

        first, second = _strings()
        for name, request in (
            ("strings_raw", InferRequest(
                STRINGS,
                [_numpy_input("INPUT0", first, "BYTES", binary=True),
                 _numpy_input("INPUT1", second, "BYTES", binary=True)])),
            ("strings_contents", InferRequest(
                STRINGS,
                [InferInput("INPUT0", [1, 16], "BYTES", data=_listed(first)),
                 InferInput("INPUT1", [1, 16], "BYTES", data=_listed(second))])),
        ):  # fmt: skip
            calls[name] = {
                "sent": _sent(INPUT0=first, INPUT1=second),
                **await _record(lambda request=request: _infer_grpc(client, request)),
            }

        wrong = InferRequest(
            DIGITS, [_numpy_input("image", np.zeros((1, 1, 8, 7), np.float32), "FP32", True)]
        )
        calls["wrong_shape"] = await _record(lambda: _infer_grpc(client, wrong))
        typed = InferRequest(
            DIGITS, [_numpy_input("image", np.zeros((1, 1, 8, 8), np.int32), "INT32", True)]
        )
        calls["wrong_datatype"] = await _record(lambda: _infer_grpc(client, typed))
        unknown = InferRequest(
            "no_such_model", [_numpy_input("image", _digits(1, seed=8), "FP32", binary=True)]
        )
        calls["unknown_model"] = await _record(lambda: _infer_grpc(client, unknown))
    finally:
        await client.close()
    return calls


async def _infer_grpc(client: InferenceGRPCClient, request: InferRequest) -> Any:
    return _answer(await client.infer(request))


async def _main(http_url: str, grpc_url: str) -> dict[str, Any]:
    return {"rest": await _rest_calls(http_url), "grpc": await _grpc_calls(grpc_url)}


if __name__ == "__main__":
    # The addresses come on standard input: importing ``kserve`` parses this process's
    # command line with its own model server's options.
    addresses = json.load(sys.stdin)
    json.dump(asyncio.run(_main(addresses["http"], addresses["grpc"])), sys.stdout)
