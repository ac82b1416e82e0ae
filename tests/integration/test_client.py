"""batchserve_client against a real server: both protocols, sync and asyncio, outputs
compared with onnxruntime run in-process on the same model files."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from batchserve_client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    InferResult,
    InvalidArgument,
    NotFound,
)

from tests.integration.server import MODEL_REPO, ServerProcess

DIGITS = "digits_cnn"
LSTM = "char_lstm"
# (url scheme, HTTP binary tensors): JSON tensors are the HTTP fallback, not the default.
PROTOCOLS = [("http", True), ("http", False), ("grpc", True)]
PROTOCOL_IDS = ["http", "http-json", "grpc"]


def _url(server: ServerProcess, scheme: str) -> str:
    return f"{scheme}://{server.http_url if scheme == 'http' else server.grpc_url}"


@pytest.fixture(params=PROTOCOLS, ids=PROTOCOL_IDS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    scheme, binary = request.param
    with Client(_url(server, scheme), binary_data=binary, timeout=30) as c:
        yield c


def _run(model: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(MODEL_REPO / model / "1" / "model.onnx"))
    return list(session.run(None, inputs))


def _digits(batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(batch, 1, 8, 8)).astype(np.float32)


def _tokens(lengths: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    for row, length in enumerate(lengths):
        tokens[row, :length] = rng.integers(3, 98, size=length)
    return {"tokens": tokens, "lengths": np.array(lengths, dtype=np.int64)[:, None]}


def _check_digits(result: InferResult, images: np.ndarray) -> None:
    logits, probabilities = _run(DIGITS, {"image": images})
    np.testing.assert_allclose(result["logits"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result["probabilities"], probabilities, rtol=1e-5, atol=1e-6)


def test_health_and_metadata(client: Client) -> None:
    assert client.is_live()
    assert client.is_ready()
    assert client.is_model_ready(DIGITS)
    assert client.is_model_ready(LSTM, version="1")
    assert not client.is_model_ready(LSTM, version="2")
    server = client.server_metadata()
    assert server.name == "triton"  # NVIDIA's examples check Triton's name
    assert "binary_tensor_data" in server.extensions
    meta = client.model_metadata(LSTM)
    assert (meta.name, meta.versions, meta.platform) == (LSTM, ("1",), "onnxruntime_onnx")
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [
        ("tokens", "INT64", (-1, -1)),
        ("lengths", "INT64", (-1, 1)),
    ]
    assert [t.name for t in meta.outputs] == ["next_char_logits"]


def test_config_and_statistics_read_the_same_on_both_protocols(server: ServerProcess) -> None:
    with Client(_url(server, "http")) as http, Client(_url(server, "grpc")) as grpc:
        config = http.model_config(LSTM)
        assert grpc.model_config(LSTM) == config
        assert config["batchserve"]["sequence_length_input"] == "lengths"
        assert config["max_batch_size"] == 64
        http.infer(DIGITS, {"image": _digits(3)})
        (stats,) = grpc.model_statistics(DIGITS)
        assert stats["inference_count"] >= 3
        assert set(http.model_statistics(DIGITS)[0]) <= set(stats)
        shipped = {entry.name for entry in MODEL_REPO.iterdir() if entry.is_dir()}
        assert {s["name"] for s in http.model_statistics()} == shipped
        assert {DIGITS, LSTM} <= shipped


def test_digits_match_onnxruntime(client: Client) -> None:
    images = _digits(5)
    result = client.infer(DIGITS, {"image": images}, request_id="req-7", priority=1)
    _check_digits(result, images)
    assert (result.model_name, result.model_version, result.id) == (DIGITS, "1", "req-7")
    assert list(result) == ["logits", "probabilities"]


def test_requests_repeating_one_shape_each_get_their_own_answer(client: Client) -> None:
    """Repeats of a request layout reuse its decoding on both protocols; each answer must
    still come from its own tensor bytes and carry its own id."""
    for seed in range(6):
        images = _digits(2, seed=seed)
        request_id = f"r{seed}" if seed >= 4 else ""
        result = client.infer(DIGITS, {"image": images}, request_id=request_id)
        _check_digits(result, images)
        assert result.id == request_id


def test_requested_outputs_only(client: Client) -> None:
    result = client.infer(DIGITS, {"image": _digits(2, seed=3)}, outputs=["probabilities"])
    assert list(result) == ["probabilities"]
    assert result["probabilities"].shape == (2, 10)
    assert result["probabilities"].dtype == np.float32


def test_variable_length_sequences_match_onnxruntime(client: Client) -> None:
    inputs = _tokens([12, 5, 30])
    result = client.infer(LSTM, inputs)
    (expected,) = _run(LSTM, inputs)
    np.testing.assert_allclose(result["next_char_logits"], expected, rtol=1e-4, atol=1e-5)


def test_a_named_datatype_converts_the_input(client: Client) -> None:
    images = _digits(2, seed=5)
    with pytest.raises(InvalidArgument, match=r"image.*FP64.*FP32"):
        client.infer(DIGITS, {"image": images.astype(np.float64)})
    result = client.infer(DIGITS, {"image": images.astype(np.float64)}, datatypes={"image": "FP32"})
    _check_digits(result, images)


def test_errors_carry_the_servers_message(client: Client) -> None:
    with pytest.raises(
        NotFound, match=r"^Request for unknown model: 'nope' is not found"
    ) as missing:
        client.infer("nope", {"image": _digits(1)})
    assert missing.value.status == 404 or missing.value.code == "NOT_FOUND"
    with pytest.raises(NotFound):
        client.model_metadata(DIGITS, version="2")
    with pytest.raises(InvalidArgument, match=r"input 'image': shape \[1, 1, 4, 8\]") as bad:
        client.infer(DIGITS, {"image": np.zeros((1, 1, 4, 8), np.float32)})
    assert bad.value.status == 400 or bad.value.code == "INVALID_ARGUMENT"
    assert client.is_ready()


def test_a_priority_past_the_model_s_levels_is_served_at_its_default(client: Client) -> None:
    """Triton's rule (L0_model_queue): 0, or a level the model does not have, is its
    default level; it used to be refused."""
    answer = client.infer(DIGITS, {"image": _digits(1)}, priority=2)
    assert answer["logits"].shape == (1, 10)


def test_a_call_that_outlives_its_timeout_raises_deadline_exceeded(client: Client) -> None:
    slow = _tokens([8192])  # about 0.2 s of compute here: the most steps a batch may hold
    with pytest.raises(DeadlineExceeded):
        client.infer(LSTM, slow, timeout=0.05)


def test_a_request_that_times_out_in_the_queue_raises_deadline_exceeded(client: Client) -> None:
    with pytest.raises(
        DeadlineExceeded, match=r"^Request timeout expired .*timed out in the queue"
    ) as late:
        client.infer(DIGITS, {"image": _digits(1)}, queue_timeout=1e-6)
    assert late.value.status == 504 or late.value.code == "DEADLINE_EXCEEDED"


def test_one_client_is_shared_by_threads(client: Client) -> None:
    batches = [_digits(1 + i % 3, seed=i) for i in range(12)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda x: client.infer(DIGITS, {"image": x}), batches))
    for result, images in zip(results, batches, strict=True):
        _check_digits(result, images)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_async_clients_run_concurrent_calls(server: ServerProcess, scheme: str) -> None:
    batches = [_digits(2, seed=i) for i in range(8)]

    async def main() -> list[InferResult]:
        async with AsyncClient(_url(server, scheme)) as c:
            assert await c.is_ready()
            assert (await c.model_metadata(DIGITS)).name == DIGITS
            with pytest.raises(NotFound, match="nope"):
                await c.model_config("nope")
            with pytest.raises(DeadlineExceeded):
                await c.infer(LSTM, _tokens([8192]), timeout=0.005)
            return await asyncio.gather(*(c.infer(DIGITS, {"image": x}) for x in batches))

    for result, images in zip(asyncio.run(main()), batches, strict=True):
        _check_digits(result, images)


def _connections_to(port: int) -> set[int]:
    """Local ports of this process's established TCP connections to ``port`` (Linux /proc)."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            ours.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state, inode = (line.split()[i] for i in (1, 2, 3, 9))
            established = state == "01" and f"socket:[{inode}]" in ours
            if established and int(remote.rsplit(":", 1)[1], 16) == port:
                found.add(int(local.rsplit(":", 1)[1], 16))
    return found


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_calls_reuse_one_connection(server: ServerProcess, scheme: str) -> None:
    port = server.http_port if scheme == "http" else server.grpc_port
    before = _connections_to(port)
    opened = []
    with Client(_url(server, scheme)) as c:
        for seed in range(5):
            c.infer(DIGITS, {"image": _digits(1, seed)})
            c.model_metadata(DIGITS)
            opened.append(_connections_to(port) - before)
    assert len(opened[0]) == 1
    assert opened == [opened[0]] * 5
    assert _closed_soon(opened[0], port)  # closed with the client


def _closed_soon(local_ports: set[int], port: int, within_s: float = 5.0) -> bool:
    """gRPC's core closes a channel's socket on its own thread, just after close() returns."""
    deadline = time.monotonic() + within_s
    while local_ports & _connections_to(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_async_calls_reuse_one_connection(server: ServerProcess) -> None:
    before = _connections_to(server.grpc_port)

    async def main() -> list[set[int]]:
        opened = []
        async with AsyncClient(_url(server, "grpc")) as c:
            for seed in range(4):
                await c.infer(DIGITS, {"image": _digits(1, seed)})
                opened.append(_connections_to(server.grpc_port) - before)
        return opened

    opened = asyncio.run(main())
    assert len(opened[0]) == 1
    assert opened == [opened[0]] * 4
