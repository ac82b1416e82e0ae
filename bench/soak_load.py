"""The soak's traffic: good requests with known answers, bad ones with known refusals.

Good requests go to every model over HTTP (binary tensors and JSON) and gRPC through
batchserve's own asyncio client, and each answer is compared with ONNX Runtime's answer
for the same input, computed in this process once at the start. Bad requests are
malformed in several ways (wrong shape, wrong datatype, unknown model, missing input,
truncated binary body, broken JSON, raw bytes that do not fit the shape) and each must
get its own 4xx status or gRPC code; a 5xx, another code or an answer is an error.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import numpy.typing as npt
import onnxruntime
import orjson
from batchserve.core.datatypes import from_config
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pbg
from batchserve_client import NO_RETRY, AsyncClient, BatchserveClientError

from bench.inputs import INT_HIGH
from bench.repo import completed_config, onnx_file

MAX_SEQUENCE = 48  # free axes (sequence lengths) vary from 1 to this
MAX_ROWS = 4  # requests to models without free axes carry 1 to this many samples
RTOL, ATOL = 1e-3, 1e-4  # batched and padded runs may round differently from a lone run
TIMEOUT_S = 30.0

Arrays = dict[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class Example:
    """One request's inputs (batch axis first) and ONNX Runtime's outputs for them."""

    inputs: Arrays
    expected: Arrays


def examples(model_dir: Path, count: int, rng: np.random.Generator) -> list[Example]:
    """``count`` varied inputs for a model, answered by its ONNX file in-process."""
    config = completed_config(model_dir)
    session = onnxruntime.InferenceSession(
        str(onnx_file(model_dir)), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    found = []
    for _ in range(count):
        length = int(rng.integers(1, MAX_SEQUENCE + 1))
        free = any(-1 in t.dims for t in config.input)
        rows = 1 if free else int(rng.integers(1, MAX_ROWS + 1))
        inputs = {}
        for tensor in config.input:
            shape = (rows, *(length if d == -1 else d for d in tensor.dims))
            dtype = from_config(tensor.data_type).numpy
            if tensor.name == config.batchserve.sequence_length_input:
                inputs[tensor.name] = np.full(shape, length, dtype=dtype)
            elif dtype.kind == "f":
                inputs[tensor.name] = rng.standard_normal(shape).astype(dtype)
            else:
                inputs[tensor.name] = rng.integers(0, INT_HIGH + 1, shape).astype(dtype)
        outputs = session.run(names, inputs)
        found.append(Example(inputs, dict(zip(names, outputs, strict=True))))
    return found


def mismatch(expected: Arrays, got: Any) -> str | None:
    """Why an answer differs from the reference, or None when every output matches."""
    for name, want in expected.items():
        have = got.get(name) if hasattr(got, "get") else None
        if have is None:
            return f"output '{name}' missing"
        if have.shape != want.shape:
            return f"output '{name}' has shape {have.shape}, not {want.shape}"
        if not np.allclose(have, want, rtol=RTOL, atol=ATOL):
            worst = float(np.max(np.abs(have - want)))
            return f"output '{name}' differs from the reference by up to {worst:.3g}"
    return None


class Clients:
    """Every connection the traffic uses, opened once and shared by all workers."""

    def __init__(self, http_port: int, grpc_port: int) -> None:
        http, target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
        self.by_route: dict[str, AsyncClient] = {
            "http-binary": AsyncClient(http, timeout=TIMEOUT_S, retry=NO_RETRY),
            "http-json": AsyncClient(http, timeout=TIMEOUT_S, retry=NO_RETRY, binary_data=False),
            "grpc": AsyncClient(f"grpc://{target}", timeout=TIMEOUT_S, retry=NO_RETRY),
        }
        # Few requests go this way, so its connections idle for seconds: dropped after 1 s,
        # well before uvicorn closes them (5 s), lest a request race that close.
        limits = httpx.Limits(keepalive_expiry=1.0)
        self.raw_http = httpx.AsyncClient(base_url=http, timeout=TIMEOUT_S, limits=limits)
        self.channel = grpc.aio.insecure_channel(target)
        self.raw_grpc = pbg.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        for client in self.by_route.values():
            await client.close()
        await self.raw_http.aclose()
        await self.channel.close(None)


# A case sends one request and returns None when the server answered as it should,
# else what was wrong.
Send = Callable[[Clients, random.Random], Awaitable[str | None]]


@dataclass(frozen=True)
class Case:
    name: str
    good: bool
    send: Send


def good_case(model: str, route: str, pool: Sequence[Example]) -> Case:
    async def send(clients: Clients, rng: random.Random) -> str | None:
        example = rng.choice(pool)
        try:
            result = await clients.by_route[route].infer(model, example.inputs)
        except BatchserveClientError as error:
            return f"{type(error).__name__} ({error.status or error.code}): {error.message}"
        return mismatch(example.expected, result)

    return Case(f"{model} {route}", True, send)


def refused_case(name: str, route: str, model: str, inputs: Arrays, status: int, code: str) -> Case:
    """A request the client can express but the server must refuse with ``status``/``code``."""

    async def send(clients: Clients, rng: random.Random) -> str | None:
        try:
            await clients.by_route[route].infer(model, inputs)
        except BatchserveClientError as error:
            if error.status is None and error.code is None:
                return f"refused by the client, not the server: {error.message}"
            if (error.status, error.code) in ((status, None), (None, code)):
                return None
            return f"{type(error).__name__} ({error.status or error.code}): {error.message}"
        return "answered instead of refused"

    return Case(f"bad: {name} ({route})", False, send)


def raw_http_case(name: str, body: bytes, headers: dict[str, str], path: str) -> Case:
    """A body no client library would send; the server must answer 400 with an error."""

    async def send(clients: Clients, rng: random.Random) -> str | None:
        try:
            response = await clients.raw_http.post(path, content=body, headers=headers)
        except httpx.HTTPError as error:
            return f"{type(error).__name__}: {error}"
        if response.status_code != 400:
            return f"HTTP {response.status_code}: {response.text[:200]}"
        return None if "error" in response.json() else "400 without an error message"

    return Case(f"bad: {name} (http-raw)", False, send)


def raw_grpc_case(name: str, request: pb.ModelInferRequest) -> Case:
    async def send(clients: Clients, rng: random.Random) -> str | None:
        try:
            await clients.raw_grpc.ModelInfer(request, timeout=TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                return None
            return f"{error.code().name}: {error.details()}"
        return "answered instead of refused"

    return Case(f"bad: {name} (grpc-raw)", False, send)


def bad_cases(image: npt.NDArray[np.float32], sequence: Arrays) -> list[Case]:
    """Malformed requests to ``digits_cnn`` (one image) and ``char_lstm`` (one sequence)."""
    wider = {"image": np.zeros((1, 1, 8, 9), dtype=np.float32)}
    as_int, as_double = {"image": image.astype(np.int32)}, {"image": image.astype(np.float64)}
    no_lengths = {"tokens": sequence["tokens"]}
    bad, invalid, missing = "INVALID_ARGUMENT", 400, ("no_such_model", 404, "NOT_FOUND")
    refused: list[tuple[str, str, str, Arrays, int, str]] = [
        ("wrong shape", "http-binary", "digits_cnn", wider, invalid, bad),
        ("wrong shape", "grpc", "digits_cnn", wider, invalid, bad),
        ("wrong datatype", "http-json", "digits_cnn", as_int, invalid, bad),
        ("wrong datatype", "grpc", "digits_cnn", as_double, invalid, bad),
        ("unknown model", "http-binary", missing[0], {"image": image}, missing[1], missing[2]),
        ("unknown model", "grpc", missing[0], {"image": image}, missing[1], missing[2]),
        ("missing input", "http-json", "char_lstm", no_lengths, invalid, bad),
        ("missing input", "grpc", "char_lstm", no_lengths, invalid, bad),
    ]
    tensor = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8]}
    head = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": image.nbytes}}]})
    length = {"Inference-Header-Content-Length": str(len(head))}
    short = pb.ModelInferRequest(model_name="digits_cnn")
    short.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    short.raw_input_contents.append(image.tobytes()[:-4])
    infer = "/v2/models/digits_cnn/infer"
    return [
        *(refused_case(*case) for case in refused),
        raw_http_case("truncated binary", head + image.tobytes()[:100], length, infer),
        raw_http_case("broken JSON", b'{"inputs": [{"name": "image", ', {}, infer),
        raw_grpc_case("raw bytes short of the shape", short),
    ]


@dataclass(frozen=True)
class Mix:
    """Which case each request is: good ones spread evenly, ``bad_fraction`` bad ones."""

    good: tuple[Case, ...]
    bad: tuple[Case, ...]
    bad_fraction: float

    def pick(self, rng: random.Random) -> Case:
        cases = self.bad if self.bad and rng.random() < self.bad_fraction else self.good
        return rng.choice(cases)

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.good + self.bad


ROUTES = ("http-binary", "http-json", "grpc")


def build_mix(
    repository: Path, models: Sequence[str], bad_fraction: float, seed: int, pool_size: int
) -> Mix:
    """Good cases for each model over each route, and the bad cases (which need both
    shipped models: their inputs are built from a ``digits_cnn`` image and a
    ``char_lstm`` sequence)."""
    rng = np.random.default_rng(seed)
    pools = {m: examples(repository / m, pool_size, rng) for m in models}
    good = tuple(good_case(m, route, pools[m]) for m in models for route in ROUTES)
    if not {"digits_cnn", "char_lstm"} <= set(models):
        return Mix(good, (), 0.0)
    image = pools["digits_cnn"][0].inputs["image"][:1]
    bad = tuple(bad_cases(image, pools["char_lstm"][0].inputs))
    return Mix(good, bad, bad_fraction)
