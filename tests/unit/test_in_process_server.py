"""``batchserve.Server``: the shipped models served inside the test process, with no socket.

Answers are checked against the model file in ONNX Runtime and against the dataplane's own
rules (the network path's words); batching is proven from the model's statistics; the sync
API is called from threads whose event loop is running, as a notebook's is.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import batchserve
import numpy as np
import onnxruntime as ort
import pytest
from batchserve.core.errors import (
    ControlDisabled,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
)
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.core.types import SequenceFlags
from batchserve.dataplane.statistics import ModelStatistics
from batchserve.runtime.in_process import SHUTTING_DOWN, Server
from batchserve.runtime.in_process_requests import infer_request, layout_key

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
MODELS = ("digits_cnn", "simple_sequence", "square_int32", "repeat_int32")
DEADLOCK_S = 60.0
"""A call that has not returned by then is taken as stuck."""

IMAGE = np.zeros((1, 1, 8, 8), np.float32)

_T = TypeVar("_T")


def _server(*models: str, **options: Any) -> Server:
    return Server(model_repository=MODEL_REPO, model_control_mode="explicit",
                  load_model=models, **options)  # fmt: skip


def _images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, 1, 8, 8)).astype(np.float32)


def _in_thread(call: Callable[[], _T]) -> _T:
    """``call`` on a thread of its own; a deadlock fails the test instead of hanging it."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=DEADLOCK_S)


def _batch_sizes(stats: ModelStatistics) -> list[int]:
    return [batch.batch_size for batch in stats.batch_stats]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The shipped models on a home loop of their own (the sync API's way)."""
    with _server(*MODELS) as running:
        yield running


# answers -------------------------------------------------------------------------------
def test_outputs_equal_the_model_file_run_in_onnx_runtime(server: Server) -> None:
    images = _images(5)
    session = ort.InferenceSession(str(MODEL_REPO / "digits_cnn" / "1" / "model.onnx"))
    logits, probabilities = session.run(None, {"image": images})
    outputs = server.infer_sync("digits_cnn", {"image": images})
    assert list(outputs) == ["logits", "probabilities"]
    np.testing.assert_allclose(outputs["logits"], logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    only = server.infer_sync("digits_cnn", {"image": images}, outputs=["probabilities"])
    assert list(only) == ["probabilities"]


def test_health_metadata_config_and_statistics_are_the_dataplanes(server: Server) -> None:
    plane = server.dataplane
    assert server.ready() is True
    assert server.model_ready("digits_cnn") is True
    assert server.model_metadata("digits_cnn") == plane.model_metadata("digits_cnn", "")
    metadata = server.model_metadata("digits_cnn", 1)
    assert (metadata.name, metadata.versions, metadata.platform) == (
        "digits_cnn", ("1",), "onnxruntime_onnx",
    )  # fmt: skip
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs] == [
        ("image", "FP32", (-1, 1, 8, 8))
    ]
    assert server.model_config("digits_cnn") == plane.model_config("digits_cnn", "")
    assert server.model_config("digits_cnn").max_batch_size == 64
    assert server.server_metadata() == plane.server_metadata()
    assert [s.name for s in server.model_statistics()] == sorted(MODELS)
    ready = {(row.name, row.state) for row in server.repository_index(ready_only=True)}
    assert ready == {(name, "READY") for name in MODELS}


def test_a_sequence_keeps_its_order_and_flags(server: Server) -> None:
    """simple_sequence answers INPUT + START, the START control filled by the batcher."""
    steps = [(1, True, False), (2, False, False), (3, False, True)]
    answers = [
        int(server.infer_sync("simple_sequence", {"INPUT": np.array([[value]], np.int32)},
                              sequence_id="s-1", sequence_start=start, sequence_end=end)
            ["OUTPUT"][0, 0])
        for value, start, end in steps
    ]  # fmt: skip
    assert answers == [2, 2, 3]


def test_classification_answers_the_k_largest_as_bytes(server: Server) -> None:
    images = _images(2)
    probabilities = server.infer_sync("digits_cnn", {"image": images})["probabilities"]
    top = server.infer_sync("digits_cnn", {"image": images}, classification={"probabilities": 2})
    assert top["probabilities"].shape == (2, 2)
    best = [int(row[0].split(b":")[1]) for row in top["probabilities"]]
    assert best == probabilities.argmax(axis=1).tolist()


# numpy in -----------------------------------------------------------------------------
def test_arrays_become_the_tensors_the_codecs_would_decode() -> None:
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    request = infer_request("m", {"s": np.array([["ab", "é"]]), "b": np.array([b"x"]),
                                  "i": big_endian, "f": strided})  # fmt: skip
    tensors = {t.name: t for t in request.inputs}
    assert tensors["s"].datatype.wire == "BYTES"
    assert tensors["s"].data.dtype == object
    assert tensors["s"].data.tolist() == [[b"ab", "é".encode()]]
    assert tensors["b"].data.tolist() == [b"x"]
    assert tensors["i"].datatype.wire == "INT32"
    assert tensors["i"].data.dtype.isnative
    assert tensors["i"].data.tolist() == big_endian.tolist()
    assert tensors["f"].data.flags.c_contiguous
    assert tensors["f"].shape == (3, 2)
    assert request.protocol == "in_process"


def test_keyword_options_win_over_the_same_parameters() -> None:
    request = infer_request("m", {}, priority=1, sequence_id=5, sequence_start=True,
                            parameters={"priority": 2, "custom": "x"})  # fmt: skip
    assert request.priority == 1
    assert request.parameters == {"custom": "x"}
    assert request.sequence == SequenceFlags(5, start=True, end=False)


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        ({"x": np.array([object()])}, {}, r"^input 'x': a BYTES element must be bytes or str"),
        ({"": IMAGE}, {}, r"^input names must be non-empty strings, got ''$"),
        ({"x": IMAGE}, {"outputs": "logits"}, r"^outputs must be a sequence of output names"),
        ({"x": IMAGE}, {"classification": {"logits": 0}},
         r"^invalid value for 'classification' parameter"),
    ],
)  # fmt: skip
def test_what_no_protocol_could_carry_is_refused_by_name(
    inputs: dict[str, np.ndarray], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        infer_request("m", inputs, **options)


def test_a_remembered_layout_never_lets_another_shape_through(server: Server) -> None:
    """Validation's verdict is kept per layout: the key must tell shapes apart."""
    server.infer_sync("digits_cnn", {"image": _images(2)})
    with pytest.raises(
        InvalidArgument, match=r"^unexpected shape for input 'image' .* got \[2,1,8,7\]"
    ):
        server.infer_sync("digits_cnn", {"image": _images(2)[..., :7]})
    key = layout_key(infer_request("m", {"x": IMAGE}).inputs, None)
    assert key != layout_key(infer_request("m", {"x": IMAGE[:, :, :7]}).inputs, None)
    assert key != layout_key(infer_request("m", {"x": IMAGE.astype(np.float64)}).inputs, None)


# streams -------------------------------------------------------------------------------
REPEAT_INPUTS = {
    "IN": np.array([4, 5, 6], np.int32),
    "DELAY": np.array([5, 5, 5], np.uint32),
    "WAIT": np.array([0], np.uint32),
}


def test_a_decoupled_model_streams_every_response(server: Server) -> None:
    squares = list(server.stream_sync("square_int32", {"IN": np.array([3], np.int32)}))
    assert [r["OUT"].tolist() for r in squares] == [[3], [3], [3]]
    repeats = list(server.stream_sync("repeat_int32", REPEAT_INPUTS))
    assert [(r["OUT"].tolist(), r["IDX"].tolist()) for r in repeats] == [
        ([4], [0]), ([5], [1]), ([6], [2]),
    ]  # fmt: skip


def test_stream_from_another_event_loop_is_bridged_to_the_home_loop(server: Server) -> None:
    async def read() -> list[list[int]]:
        return [r["OUT"].tolist() async for r in server.stream("repeat_int32", REPEAT_INPUTS)]

    assert _in_thread(lambda: asyncio.run(read())) == [[4], [5], [6]]


def test_stream_of_a_model_that_answers_once_gives_its_one_answer(server: Server) -> None:
    responses = list(server.stream_sync("digits_cnn", {"image": _images(1)}))
    assert len(responses) == 1
    assert responses[0]["logits"].shape == (1, 10)


def test_stream_errors_are_raised_by_the_iteration(server: Server) -> None:
    with pytest.raises(InvalidArgument, match=r"^unexpected input 'in': model 'square_int32'"):
        list(server.stream_sync("square_int32", {"in": np.array([3], np.int32)}))

    async def read() -> None:
        async for _ in server.stream("square_int32", {"in": np.array([3], np.int32)}):
            pass

    with pytest.raises(InvalidArgument, match=r"^unexpected input 'in'"):
        _in_thread(lambda: asyncio.run(read()))


# errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inputs", "options", "error", "message"),
    [
        ("digits_cnn", {"imag": IMAGE}, {}, InvalidArgument,
         r"^unexpected input 'imag': model 'digits_cnn' takes \['image'\]$"),
        ("digits_cnn", {"image": IMAGE.astype(np.float64)}, {}, InvalidArgument,
         r"^inference input 'image' data-type is 'FP64', but model 'digits_cnn' expects "
         r"'FP32' \(batchserve: input 'image': datatype FP64 does not match the model's "
         r"FP32\)$"),
        ("digits_cnn", {"image": IMAGE[:, 0]}, {}, InvalidArgument,
         r"^unexpected shape for input 'image' for model 'digits_cnn'\. Expected "
         r"\[-1,1,8,8\], got \[1,8,8\] \(batchserve: input 'image': shape \[1, 8, 8\]"),
        ("digits_cnn", {"image": np.zeros((65, 1, 8, 8), np.float32)}, {}, InvalidArgument,
         r"^inference request batch-size must be <= 64 for 'digits_cnn' \(batchserve: "
         r"input 'image': batch size 65 is outside 1\.\.64"),
        ("digits_cnn", {}, {}, InvalidArgument,
         r"^expected 1 inputs but got 0 inputs for model 'digits_cnn'"),
        ("digits_cnn", {"image": IMAGE.astype(np.complex64)}, {}, InvalidArgument,
         r"^input 'image': numpy dtype complex64 has no protocol datatype"),
        ("digits_cnn", {"image": IMAGE}, {"outputs": ["logit"]}, InvalidArgument,
         r"^unexpected inference output 'logit' for model 'digits_cnn' \(batchserve: the model "
         r"produces \['logits', 'probabilities'\]\)$"),
        ("digits_cnn", {"image": IMAGE}, {"timeout_us": -1}, InvalidArgument,
         r"^request parameter 'timeout' must be an integer >= 0, got -1$"),
        ("digits_cnn", {"image": IMAGE}, {"sequence_id": 3}, InvalidArgument,
         r"^request parameter 'sequence_id': model 'digits_cnn' does not use sequence batching"),
        ("simple_sequence", {"INPUT": np.array([[1]], np.int32)}, {"sequence_id": 9},
         InvalidArgument, r"must specify the START flag on the first request of the sequence$"),
        ("digit_cnn", {"image": IMAGE}, {}, NotFound,
         r"^Request for unknown model: 'digit_cnn' is not found"),
        ("square_int32", {"IN": np.array([3], np.int32)}, {}, Unsupported,
         r"^infer doesn't support models with decoupled transaction policy \(batchserve: model "
         r"'square_int32' may answer any number of times: iterate Server\.stream\)$"),
    ],
)  # fmt: skip
def test_errors_are_the_dataplanes_types_and_words(
    server: Server,
    model: str,
    inputs: dict[str, np.ndarray],
    options: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        server.infer_sync(model, inputs, **options)


def test_a_refused_request_counts_as_a_failure_of_its_model(server: Server) -> None:
    failed = server.model_statistics("digits_cnn")[0].inference_stats.fail.count
    with pytest.raises(InvalidArgument):
        server.infer_sync("digits_cnn", {"image": IMAGE.astype(np.float64)})
    assert server.model_statistics("digits_cnn")[0].inference_stats.fail.count == failed + 1


def test_model_control_is_refused_when_it_is_off() -> None:
    with Server(model_repository=MODEL_REPO / ".." / "model_repo", load_model=()) as server:
        assert server.settings.model_control_mode is ModelControlMode.NONE
        with pytest.raises(ControlDisabled, match=r"^explicit model load / unload is not allowed"):
            server.load_sync("digits_cnn")
        with pytest.raises(ControlDisabled):
            server.unload_sync("digits_cnn")


# batching ------------------------------------------------------------------------------
def test_calls_from_32_threads_share_batches() -> None:
    calls = 32
    with _server("digits_cnn") as server:
        start = threading.Barrier(calls)

        def call(index: int) -> np.ndarray:
            start.wait()
            return server.infer_sync("digits_cnn", {"image": _images(1, index)})["logits"]

        with ThreadPoolExecutor(calls) as pool:
            answers = list(pool.map(call, range(calls)))
        stats = server.model_statistics("digits_cnn")[0]
    assert all(answer.shape == (1, 10) for answer in answers)
    warm_up = 0  # warm-up batches run on the instance directly, not through the batcher
    assert stats.inference_count - warm_up == calls
    assert stats.execution_count < calls
    assert max(_batch_sizes(stats)) > 1


@pytest.mark.anyio
async def test_32_concurrent_tasks_share_batches() -> None:
    async with _server("digits_cnn") as server:
        answers = await asyncio.gather(
            *(server.infer("digits_cnn", {"image": _images(1, i)}) for i in range(32))
        )
        stats = server.model_statistics("digits_cnn")[0]
    assert len(answers) == 32
    assert stats.inference_count == 32
    assert stats.execution_count < 32
    assert max(_batch_sizes(stats)) > 1
    # Triton's compute statistics count requests, each adding its batch's time (one sample
    # a request here, so a batch of n answered n requests)
    compute = stats.inference_stats.compute_infer
    assert compute.count == stats.inference_stats.success.count == 32
    assert compute.ns == sum(b.batch_size * b.compute_infer.ns for b in stats.batch_stats)


# event loops and threads ---------------------------------------------------------------
def test_the_sync_api_works_inside_a_running_event_loop() -> None:
    """A notebook cell: the thread runs a loop and the cell's code calls the sync API."""

    async def cell() -> tuple[bool, tuple[int, ...], list[int]]:
        assert asyncio.get_running_loop().is_running()
        with _server("digits_cnn", "square_int32") as server:
            logits = server.infer_sync("digits_cnn", {"image": _images(2)})["logits"]
            stream = server.stream_sync("square_int32", {"IN": np.array([2], np.int32)})
            squares = [r["OUT"][0] for r in stream]
            return server.ready(), logits.shape, [int(s) for s in squares]

    assert _in_thread(lambda: asyncio.run(cell())) == (True, (2, 10), [2, 2])


@pytest.mark.anyio
async def test_the_sync_api_on_the_home_loops_thread_is_refused_not_a_deadlock() -> None:
    async with _server("digits_cnn") as server:
        with pytest.raises(RuntimeError, match="would wait for itself forever"):
            server.infer_sync("digits_cnn", {"image": IMAGE})
        with pytest.raises(RuntimeError, match="would wait for itself forever"):
            server.stream_sync("digits_cnn", {"image": IMAGE}).__next__()
        # other threads may use the sync API while this loop runs
        answer = await asyncio.to_thread(server.infer_sync, "digits_cnn", {"image": IMAGE})
        assert answer["logits"].shape == (1, 10)
        assert await asyncio.to_thread(server.model_ready, "digits_cnn") is True


def test_async_calls_from_other_loops_reach_the_home_loop(server: Server) -> None:
    async def call() -> tuple[int, ...]:
        return (await server.infer("digits_cnn", {"image": _images(3)}))["logits"].shape

    assert _in_thread(lambda: asyncio.run(call())) == (3, 10)


def test_no_socket_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[object, ...]] = []
    real = socket.socket.__init__

    def record(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        opened.append(args)
        real(self, *args, **kwargs)

    with _server("digits_cnn") as server:
        monkeypatch.setattr(socket.socket, "__init__", record)
        server.infer_sync("digits_cnn", {"image": IMAGE})
        monkeypatch.undo()
    assert opened == []
    assert not hasattr(server, "http")
    assert not hasattr(server, "grpc")


# lifecycle -----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_stop_answers_the_requests_already_accepted() -> None:
    server = await _server("digits_cnn", "repeat_int32").start()
    slow = {**REPEAT_INPUTS, "DELAY": np.array([150, 150, 150], np.uint32)}
    first = asyncio.Event()

    async def read_stream() -> list[int]:
        outs = []
        async for response in server.stream("repeat_int32", slow):
            outs.append(int(response["OUT"][0]))
            first.set()
        return outs

    streaming = asyncio.create_task(read_stream())
    await first.wait()  # the stream is mid-way
    inferring = [asyncio.create_task(server.infer("digits_cnn", {"image": _images(1, i)}))
                 for i in range(16)]  # fmt: skip
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0)  # the infers are queued in the batcher, the drain has begun
    assert server.in_flight == 17
    assert server.ready() is False
    with pytest.raises(Unavailable, match=f"^{SHUTTING_DOWN}$"):
        await server.infer("digits_cnn", {"image": IMAGE})
    await stopping
    assert await streaming == [4, 5, 6]
    assert all(answer["logits"].shape == (1, 10) for answer in await asyncio.gather(*inferring))
    assert server.registry.loaded() == []


def test_a_model_that_fails_to_load_leaves_the_server_not_ready(tmp_path: Path) -> None:
    """As ``serve``: the failure is kept as the model's reason, the others still serve."""
    for name in ("digits_cnn", "simple_sequence"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_bytes(
            (MODEL_REPO / name / "config.pbtxt").read_bytes()
        )
    model = (MODEL_REPO / "digits_cnn" / "1" / "model.onnx").read_bytes()
    (tmp_path / "digits_cnn" / "1" / "model.onnx").write_bytes(model[:40] + b"\xff" * 40)
    (tmp_path / "simple_sequence" / "1" / "model.onnx").write_bytes(
        (MODEL_REPO / "simple_sequence" / "1" / "model.onnx").read_bytes()
    )
    with Server(model_repository=tmp_path) as server:
        assert server.ready() is False
        assert server.model_ready("simple_sequence") is True
        assert server.model_ready("digits_cnn") is False
        with pytest.raises(Unavailable, match="digits_cnn"):
            server.infer_sync("digits_cnn", {"image": IMAGE})


def test_explicit_control_loads_and_unloads() -> None:
    with _server() as server:
        assert server.ready() is True  # no start-up model to wait for
        assert server.model_ready("digits_cnn") is False
        server.load_sync("digits_cnn")
        assert server.model_ready("digits_cnn") is True
        assert server.infer_sync("digits_cnn", {"image": IMAGE})["logits"].shape == (1, 10)
        server.unload_sync("digits_cnn")
        assert server.model_ready("digits_cnn") is False
        with pytest.raises(NotFound, match=r"^failed to load 'nope', failed to poll"):
            server.load_sync("nope")


def test_settings_are_the_servers() -> None:
    settings = Settings(model_repository=MODEL_REPO, max_queue_size=7)
    assert Server(settings).settings is settings
    assert Server(model_repository=MODEL_REPO, memory_budget="cpu=1GiB").settings.memory_budget
    with pytest.raises(TypeError, match="either settings or keyword options"):
        Server(settings, max_queue_size=3)
    with pytest.raises(ValueError, match="max_queue_size"):
        Server(model_repository=MODEL_REPO, max_queue_size=0)


def test_the_batching_settings_reach_the_models() -> None:
    """``wait_out_queue_delay`` and ``delay_scheduler`` are the served models' too, as with
    ``batchserve serve`` (the in-process server once dropped the first)."""
    with _server(
        "digits_cnn", "simple_sequence", wait_out_queue_delay=True, delay_scheduler=2,
        backlog_delay_scheduler=1,
    ) as server:  # fmt: skip
        policy = server.registry.get("digits_cnn").batcher.policy
        steps = server.registry.get("simple_sequence").batcher.policy
    assert (policy.wait_out_queue_delay, policy.hold_first_batch) == (True, 2)
    assert (steps.hold_first_batch, steps.hold_backlog) == (2, 1)  # a sequence model's backlog
    with _server("digits_cnn") as server:
        policy = server.registry.get("digits_cnn").batcher.policy
    assert (policy.wait_out_queue_delay, policy.hold_first_batch, policy.hold_backlog) == (
        False, 0, 0)  # fmt: skip


def test_a_stopped_server_refuses_to_start_again_and_calls_are_told_why() -> None:
    server = _server("digits_cnn")
    with pytest.raises(RuntimeError, match="the server is not started"):
        server.infer_sync("digits_cnn", {"image": IMAGE})
    with server, pytest.raises(RuntimeError, match="already started"):
        server.start_sync()
    server.stop_sync()  # a second stop does nothing
    with pytest.raises(RuntimeError, match="was stopped: make a new one"):
        server.start_sync()
    with pytest.raises(RuntimeError, match="was stopped"):
        server.infer_sync("digits_cnn", {"image": IMAGE})


def test_importing_batchserve_does_not_import_the_server() -> None:
    code = (
        "import sys, batchserve\n"
        "assert not [m for m in sys.modules if m.startswith('batchserve.runtime')]\n"
        "from batchserve.runtime.in_process import Server\n"
        "assert batchserve.Server is Server\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert batchserve.Server is Server


def test_the_readme_example_runs() -> None:
    readme = (MODEL_REPO.parent / "README.md").read_text()
    section = readme.split("## In-process Python API", 1)[1].split("\n## ", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run([sys.executable, "-c", example], cwd=MODEL_REPO.parent,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("True (TensorMetadata(name='image', datatype='FP32'")
    assert lines[2:5] == ["[3]", "[3]", "[3]"]
    count, batches = map(int, lines[5].split())
    assert count == 32
    assert batches < 32


def test_an_unknown_keyword_option_is_refused_not_ignored() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): timeout"):
        infer_request("m", {"x": IMAGE}, timeout=5)  # type: ignore[call-arg]
