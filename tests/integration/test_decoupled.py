"""Decoupled models through a real server, by Triton's own clients and perf_analyzer.

The flows of NVIDIA's decoupled examples (``repeat_int32``, ``square_int32``) over a gRPC
stream, Triton's refusals for one-response calls, and text generation with step-level
batching (``char_lstm_generate``) over gRPC streams and the HTTP generate extension,
checked against the stateless ``char_lstm`` run in-process. By one process and by two
workers.
"""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve.zoo.char_lstm import PAD, decode_id, encode
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.server import (
    MODEL_REPO,
    ServerProcess,
    run_perf_analyzer,
    start_server,
    tree_memory_mib,
)

Result = tuple[Any, InferenceServerException | None]


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def decoupled_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    server = start_server(MODEL_REPO, ["--workers", request.param])
    yield server
    assert server.stop() == 0


class Stream:
    """A tritonclient gRPC stream whose results queue up for the test to read."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[Result] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def next(self) -> Any:
        result, error = self.results.get(timeout=30)
        assert error is None, error
        return result

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(decoupled_server: ServerProcess) -> Iterator[Stream]:
    opened = Stream(decoupled_server)
    yield opened
    opened.close()


def _tensor(module: Any, name: str, values: list[Any], datatype: str) -> Any:
    dtypes = {"INT32": np.int32, "UINT32": np.uint32, "FP32": np.float32, "UINT64": np.uint64,
              "BOOL": np.bool_, "BYTES": np.object_}  # fmt: skip
    tensor = module.InferInput(name, [len(values)], datatype)
    tensor.set_data_from_numpy(np.array(values, dtype=dtypes[datatype]))
    return tensor


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _repeat_inputs(values: list[int], delays: list[int]) -> list[Any]:
    return [_tensor(grpcclient, "IN", values, "INT32"),
            _tensor(grpcclient, "DELAY", delays, "UINT32"),
            _tensor(grpcclient, "WAIT", [5], "UINT32")]  # fmt: skip


def test_repeat_answers_each_element_in_order_as_the_custom_repeat_example(
    stream: Stream,
) -> None:
    """What ``simple_grpc_custom_repeat.py`` sends and checks, with shorter delays."""
    values = list(range(100, 110))
    stream.client.async_stream_infer(
        "repeat_int32", _repeat_inputs(values, [10] * 10),
        outputs=[grpcclient.InferRequestedOutput("OUT")],
    )  # fmt: skip
    for value in values:
        result = stream.next()
        assert result.as_numpy("OUT").tolist() == [value]
        assert not _final(result)
    # no empty final response unless asked for: nothing more arrives
    with pytest.raises(queue.Empty):
        stream.results.get(timeout=0.3)


def test_an_empty_final_response_comes_only_when_asked_for(stream: Stream) -> None:
    """What perf_analyzer relies on: the bare final flag as an empty response with the id."""
    stream.client.async_stream_infer(
        "repeat_int32", _repeat_inputs([4, 2, 0, 1], [1, 2, 3, 4]), request_id="r7",
        enable_empty_final_response=True,
    )  # fmt: skip
    got = [stream.next() for _ in range(5)]
    assert [r.as_numpy("OUT").tolist() for r in got[:4]] == [[4], [2], [0], [1]]
    assert [r.as_numpy("IDX").tolist() for r in got[:4]] == [[0], [1], [2], [3]]
    assert [_final(r) for r in got] == [False] * 4 + [True]
    assert all(r.get_response().id == "r7" for r in got)
    assert not got[4].get_response().outputs


def test_square_sends_n_responses_per_request_as_the_square_client(stream: Stream) -> None:
    """What the Python backend's ``square_client.py`` sends and checks."""
    counts = [4, 2, 0, 1]
    for index, count in enumerate(counts):
        stream.client.async_stream_infer(
            "square_int32", [_tensor(grpcclient, "IN", [count], "INT32")], request_id=str(index)
        )
    seen: dict[str, int] = {}
    for _ in range(sum(counts)):
        result = stream.next()
        request_id = result.get_response().id
        assert result.as_numpy("OUT").tolist() == [counts[int(request_id)]]
        seen[request_id] = seen.get(request_id, 0) + 1
    assert seen == {"0": 4, "1": 2, "3": 1}  # none at all for the count of 0
    with pytest.raises(queue.Empty):
        stream.results.get(timeout=0.3)


def test_each_answered_request_counts_as_one_execution_of_its_replies_time(
    decoupled_server: ServerProcess, stream: Stream
) -> None:
    """As Triton's repeat backend reports a decoupled request (batch statistics of size 1,
    the execution its compute): perf_analyzer's server-side figures and the dashboards'
    execution rates read these, and they stayed 0."""
    before = _statistics(decoupled_server, "repeat_int32")
    stream.client.async_stream_infer("repeat_int32", _repeat_inputs([1, 2, 3], [20, 20, 20]))
    assert [stream.next().as_numpy("OUT").tolist() for _ in range(3)] == [[1], [2], [3]]
    deadline = time.monotonic() + 5
    while (after := _statistics(decoupled_server, "repeat_int32"))["inference_count"] == before[
        "inference_count"
    ] and time.monotonic() < deadline:
        time.sleep(0.02)  # the statistics follow the final reply
    assert int(after["inference_count"]) - int(before["inference_count"]) == 1
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1
    infer = after["inference_stats"]["compute_infer"]
    earlier = before["inference_stats"]["compute_infer"]
    assert int(infer["count"]) - int(earlier["count"]) == 1
    # three replies 20 ms apart; libuv's timers count whole milliseconds from the loop's
    # cached clock, so each sleep may end up to 1 ms early (one run measured 59.9995 ms)
    assert int(infer["ns"]) - int(earlier["ns"]) >= 57_000_000
    (size_one,) = after["batch_stats"]
    assert size_one["batch_size"] == 1


def _response_stats(server: ServerProcess, model: str) -> dict[str, dict[str, dict[str, int]]]:
    """Triton's ``response_stats`` of the model over HTTP, checked equal to gRPC's."""
    http = httpclient.InferenceServerClient(server.http_url)
    (over_http,) = http.get_inference_statistics(model)["model_stats"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    (over_grpc,) = grpc.get_inference_statistics(model, as_json=True)["model_stats"]
    stats: dict[str, dict[str, dict[str, int]]] = over_http["response_stats"]
    assert {
        index: {kind: {"count": int(d.get("count", 0)), "ns": int(d.get("ns", 0))}
                for kind, d in by_kind.items()}
        for index, by_kind in over_grpc.get("response_stats", {}).items()  # none: left out
    } == stats  # fmt: skip
    return stats


def test_each_response_of_a_request_is_counted_by_its_index(
    decoupled_server: ServerProcess, stream: Stream
) -> None:
    """L0_response_statistics' test_response_statistics: square's N responses count as
    successes at indexes 0..N-1, its bare final flag as an empty response at N, over HTTP
    and gRPC alike, summed over requests of 4, 6 and 3 responses."""
    before = _response_stats(decoupled_server, "square_int32")
    counts = [4, 6, 3]
    for count in counts:
        stream.client.async_stream_infer(
            "square_int32", [_tensor(grpcclient, "IN", [count], "INT32")]
        )
    for _ in range(sum(counts)):
        stream.next()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = _response_stats(decoupled_server, "square_int32")
        if sum(
            after.get(str(n), {}).get("empty_response", {}).get("count", 0) for n in counts
        ) - sum(
            before.get(str(n), {}).get("empty_response", {}).get("count", 0) for n in counts
        ) == len(counts):
            break
        time.sleep(0.02)  # the statistics follow the final reply

    def added(index: int, kind: str, field: str = "count") -> int:
        now = after.get(str(index), {}).get(kind, {}).get(field, 0)
        return now - before.get(str(index), {}).get(kind, {}).get(field, 0)

    for index in range(max(counts) + 1):
        succeeded = sum(1 for n in counts if n > index)
        empty = sum(1 for n in counts if n == index)
        assert added(index, "success") == succeeded, index
        assert added(index, "empty_response") == empty, index
        assert added(index, "compute_infer") == succeeded + empty, index
        assert added(index, "compute_output") == succeeded, index
        assert added(index, "fail") == added(index, "cancel") == 0, index
    # these requests' own times (the totals hold other tests' requests, whose empty
    # responses at index 0 add compute time and no success)
    assert added(0, "success", "ns") >= added(0, "compute_infer", "ns") > 0


class HeldStream:
    """A tritonclient stream whose callback stops after ``taken`` results until released: a
    Triton user's slow callback, so tritonclient stops reading the stream."""

    def __init__(self, server: ServerProcess, taken: int) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[Result] = queue.Queue()
        self.released = threading.Event()
        self._taken = taken
        self.client.start_stream(callback=self._callback)

    def _callback(self, result: Any, error: InferenceServerException | None) -> None:
        self.results.put((result, error))
        if self.results.qsize() >= self._taken:
            self.released.wait(60)

    def take(self, count: int) -> list[Any]:
        taken = [self.results.get(timeout=60) for _ in range(count)]
        assert not [error for _, error in taken if error is not None]
        return [result for result, _ in taken]

    def close(self) -> None:
        self.released.set()
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


SLOW_READER_COUNT = 100_000_000
MOST_GROWTH_MIB = 100
"""Queued ahead of the client, square's responses grew one process by 2 GB in 15 s and two
workers' server by 3.5 GB in 35 s; held back, the server stays within its noise."""


def test_a_client_that_reads_slowly_holds_the_responder_not_the_servers_memory(
    decoupled_server: ServerProcess,
) -> None:
    """One request for 100,000,000 responses on a stream whose client takes three, pauses
    four seconds, then takes a hundred more: they come in order, and the server (workers
    included) does not queue what the client has not asked for."""
    stream = HeldStream(decoupled_server, taken=3)
    try:
        stream.client.async_stream_infer(
            "square_int32", [_tensor(grpcclient, "IN", [SLOW_READER_COUNT], "INT32")]
        )
        first = stream.take(3)
        before = tree_memory_mib(decoupled_server.process.pid)
        time.sleep(4)
        grown = tree_memory_mib(decoupled_server.process.pid) - before
        stream.released.set()
        more = stream.take(100)
    finally:
        stream.close()
    for result in first + more:
        assert result.as_numpy("OUT").tolist() == [SLOW_READER_COUNT]
    assert grown < MOST_GROWTH_MIB
    after = Stream(decoupled_server)  # the responder stopped with the client: others served
    try:
        after.client.async_stream_infer("square_int32", [_tensor(grpcclient, "IN", [2], "INT32")])
        assert [after.next().as_numpy("OUT").tolist() for _ in range(2)] == [[2], [2]]
    finally:
        after.close()


PIPELINED = 10_000
"""Requests piped down one stream. The server grew by 1-14 MiB with these, with both stream
bounds on and (tried by hand) with both off, at 20,000 and at 60,000: on a server no faster
than its client, reading paces itself. So these two check that piped requests are all
answered in full without growth; the bounds themselves are unit-tested."""


def test_tritonclient_requests_piped_behind_a_held_callback_are_all_answered(
    decoupled_server: ServerProcess,
) -> None:
    """10,000 digits_cnn requests sent down one tritonclient stream whose callback holds
    the first answer for three seconds, as a Triton user's slow callback would: the stream's
    bounds pace them without loss, and every one is answered in full once the callback lets
    go. (tritonclient sends more slowly than a raw stub, so the growth a raw client caused
    is the next test's; this one is the bounds as Triton's own client meets them.)"""
    image = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.zeros((1, 1, 8, 8), dtype=np.float32))
    stream = HeldStream(decoupled_server, taken=1)
    try:
        before = tree_memory_mib(decoupled_server.process.pid)
        for _ in range(PIPELINED):
            stream.client.async_stream_infer("digits_cnn", [image])
        time.sleep(3)
        grown = tree_memory_mib(decoupled_server.process.pid) - before
        stream.released.set()
        answers = stream.take(PIPELINED)
    finally:
        stream.close()
    assert grown < MOST_GROWTH_MIB
    for answer in answers:
        assert answer.as_numpy("logits").shape == (1, 10)
        assert answer.as_numpy("probabilities").shape == (1, 10)


def test_requests_piped_down_a_stream_that_is_never_read_wait_in_the_clients_buffers(
    decoupled_server: ServerProcess,
) -> None:
    """10,000 digits_cnn requests sent down one stream whose client reads nothing for a
    while: each answered request held its response in the server (1.2 GB for 200,000)
    until the stream stopped reading past ``STREAM_REQUESTS`` at once; then all are
    answered, in full, once the client reads."""
    channel = grpc.insecure_channel(decoupled_server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    request.raw_input_contents.append(np.zeros(64, dtype=np.float32).tobytes())
    sent = threading.Event()

    def requests() -> Iterator[Any]:
        for _ in range(PIPELINED):
            yield request
        sent.set()

    before = tree_memory_mib(decoupled_server.process.pid)
    responses = stub.ModelStreamInfer(requests())
    try:
        time.sleep(3)
        grown = tree_memory_mib(decoupled_server.process.pid) - before
        answers = [next(responses) for _ in range(PIPELINED)]
        assert sent.wait(30)
    finally:
        responses.cancel()
        channel.close()
    assert grown < MOST_GROWTH_MIB
    assert not [answer.error_message for answer in answers if answer.error_message]
    assert {len(answer.infer_response.raw_output_contents) for answer in answers} == {2}


def test_one_response_calls_are_refused_in_triton_s_words(
    decoupled_server: ServerProcess,
) -> None:
    grpc_client = grpcclient.InferenceServerClient(decoupled_server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        grpc_client.infer("square_int32", [_tensor(grpcclient, "IN", [1], "INT32")])
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(
        refused.value
    )
    http_client = httpclient.InferenceServerClient(decoupled_server.http_url)
    with pytest.raises(InferenceServerException) as refused:
        http_client.infer("square_int32", [_tensor(httpclient, "IN", [1], "INT32")])
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(
        refused.value
    )
    assert refused.value.status() == "501"


def test_an_error_on_a_stream_names_the_request_and_the_stream_goes_on(stream: Stream) -> None:
    stream.client.async_stream_infer("repeat_int32", _repeat_inputs([1, 2], [1]))
    _, error = stream.results.get(timeout=30)
    assert error is not None
    assert "expected IN and DELAY shape to match, got [2] and [1]" in str(error)
    stream.client.async_stream_infer("square_int32", [_tensor(grpcclient, "IN", [1], "INT32")])
    assert stream.next().as_numpy("OUT").tolist() == [1]


def test_perf_analyzer_drives_a_decoupled_model_over_a_stream(
    decoupled_server: ServerProcess, tmp_path: Path
) -> None:
    data = tmp_path / "square.json"
    data.write_text(json.dumps({"data": [{"IN": [3]}]}))
    run_perf_analyzer("square_int32", "grpc", decoupled_server.grpc_url, "--streaming",
                      "--async", "--input-data", str(data), "--concurrency-range", "4")  # fmt: skip


def test_perf_analyzer_streams_sequences_through_the_stream_bounds(
    decoupled_server: ServerProcess,
) -> None:
    """perf_analyzer's streaming mode keeps many sequences' steps in flight on its streams;
    the bounds on a stream (``grpc/streams.py``) must pace none of them into failure."""
    report = run_perf_analyzer("simple_sequence", "grpc", decoupled_server.grpc_url,
                               "--streaming", "--concurrency-range", "64")  # fmt: skip
    assert "Sequence count:" in report


# generation ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_reference() -> Any:
    """Greedy continuation by the stateless char_lstm, run in-process on each prefix."""
    session = ort.InferenceSession(str(MODEL_REPO / "char_lstm/1/model.onnx"))

    def continuation(prompt: str, characters: int) -> str:
        tokens = encode(prompt).tolist()
        text = ""
        for _ in range(characters):
            ids = np.array([tokens], dtype=np.int64)
            lengths = np.array([[len(tokens)]], dtype=np.int64)
            (logits,) = session.run(None, {"tokens": ids, "lengths": lengths})
            logits[0, PAD] = -np.inf
            token = int(logits[0].argmax())
            tokens.append(token)
            text += decode_id(token)
        return text

    return continuation


def _generate_inputs(prompt: str, tokens: int, temperature: float, seed: int) -> list[Any]:
    return [_tensor(grpcclient, "text_input", [prompt.encode()], "BYTES"),
            _tensor(grpcclient, "max_tokens", [tokens], "INT32"),
            _tensor(grpcclient, "temperature", [temperature], "FP32"),
            _tensor(grpcclient, "random_seed", [seed], "UINT64")]  # fmt: skip


def _stream_generation(server: ServerProcess, prompt: str, tokens: int, temperature: float,
                       seed: int, start: threading.Barrier | None = None) -> list[str]:  # fmt: skip
    """The pieces a generation streams; with ``start``, its request waits for the others'
    streams to open (opening one takes longer than a short generation runs)."""
    stream = Stream(server)
    try:
        if start is not None:
            start.wait(timeout=30)
        stream.client.async_stream_infer(
            "char_lstm_generate", _generate_inputs(prompt, tokens, temperature, seed),
            request_id=f"g{seed}",
        )  # fmt: skip
        pieces = []
        while True:
            result = stream.next()
            assert result.get_response().id == f"g{seed}"
            pieces.append(result.as_numpy("text_output")[0].decode())
            if _final(result):
                return pieces
    finally:
        stream.close()


def test_a_greedy_generation_streams_what_char_lstm_continues(
    decoupled_server: ServerProcess, greedy_reference: Any
) -> None:
    prompt = "def __init__(self"
    pieces = _stream_generation(decoupled_server, prompt, 40, 0.0, 1)
    assert len(pieces) == 40
    assert all(len(piece) == 1 for piece in pieces)  # one character per response
    assert "".join(pieces) == greedy_reference(prompt, 40)


def _statistics(server: ServerProcess, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def test_concurrent_generations_share_steps_and_each_is_what_it_is_alone(
    decoupled_server: ServerProcess,
) -> None:
    """Sampled generations with their own seeds give the same text run together as alone,
    and run together their steps share batches of the step model."""
    prompts = [("import ", 11), ("class ", 12), ("    return ", 13), ("for i in ", 14)] * 2
    alone = [_stream_generation(decoupled_server, p, 30, 0.8, seed) for p, seed in prompts[:4]]
    before = _statistics(decoupled_server, "char_lstm_step")
    start = threading.Barrier(len(prompts))
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ps: _stream_generation(
            decoupled_server, ps[0], 30, 0.8, ps[1], start), prompts))  # fmt: skip
    assert together == alone + alone
    after = _statistics(decoupled_server, "char_lstm_step")
    steps = int(after["execution_count"]) - int(before["execution_count"])
    rows = int(after["inference_count"]) - int(before["inference_count"])
    assert rows == sum(len(p) + 30 - 1 for p, _ in prompts)  # one row per generation step
    assert rows / steps >= 2  # generations ran in shared steps, not one by one


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        text = self.body.decode()
        assert text.endswith("\n\n")
        return [json.loads(chunk.removeprefix("data: ")) for chunk in text.split("\n\n") if chunk]


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return Answer(response.status, response.getheader("content-type", ""), response.read())
    finally:
        connection.close()


def test_http_generate_stream_sends_each_character_as_an_event_and_generate_the_whole(
    decoupled_server: ServerProcess,
) -> None:
    body = {"text_input": "while ", "max_tokens": 25, "temperature": 0.7, "random_seed": 5}
    streamed = _post(decoupled_server, "/v2/models/char_lstm_generate/generate_stream", body)
    assert streamed.status == 200
    assert streamed.content_type == "text/event-stream; charset=utf-8"
    events = streamed.events()
    assert len(events) == 25
    assert {e["model_name"] for e in events} == {"char_lstm_generate"}
    text = "".join(e["text_output"] for e in events)
    whole = _post(decoupled_server, "/v2/models/char_lstm_generate/generate", body)
    assert whole.status == 200
    assert whole.json() == {
        "model_name": "char_lstm_generate", "model_version": "1", "text_output": text,
    }  # fmt: skip
    # the same request over a gRPC stream gives the same characters
    assert "".join(_stream_generation(decoupled_server, "while ", 25, 0.7, 5)) == text


@pytest.mark.parametrize(
    ("body", "status", "problem"),
    [
        ({"text_input": ""}, 400, "input 'text_input': the prompt is empty"),
        ({"text_input": "x", "max_tokens": 0}, 400, "input 'max_tokens': 0 is outside 1..1024"),
        ({"text_input": "x", "temperature": -1}, 400, "input 'temperature'"),
        ({"text_input": 3}, 400, "attempt to access JSON non-string as string (batchserve: "
         "tensor 'text_input': BYTES data must be strings, got 3)"),
        ({"text_input": "x", "stream": "false"}, 400,
         "attempt to access JSON non-boolean as boolean"),
        ({"max_tokens": 3}, 400, "missing required input(s) ['text_input']"),
        ({"text_input": "x", "random_seed": -1}, 400, "outside the range of UINT64"),
        # once silently ignored, where infer refuses them
        ({"text_input": "x", "sequence_id": 7, "sequence_start": True}, 400,
         "model 'char_lstm_generate' does not use sequence batching"),
    ],
)  # fmt: skip
def test_bad_generate_requests_get_a_clear_400(
    decoupled_server: ServerProcess, body: dict[str, Any], status: int, problem: str
) -> None:
    for route in ("generate", "generate_stream"):
        answer = _post(decoupled_server, f"/v2/models/char_lstm_generate/{route}", body)
        assert answer.status == status
        assert problem in answer.json()["error"]


def test_generate_refuses_a_model_that_answers_several_times_as_triton(
    decoupled_server: ServerProcess,
) -> None:
    body = {"IN": [1, 2], "DELAY": [1, 1], "WAIT": 1}
    answer = _post(decoupled_server, "/v2/models/repeat_int32/generate", body)
    assert answer.status == 400
    assert answer.json()["error"].startswith("generate expects model to produce exactly 1 response")
    events = _post(decoupled_server, "/v2/models/repeat_int32/generate_stream", body).events()
    assert [(e["OUT"], e["IDX"]) for e in events] == [(1, 0), (2, 1)]


def test_generate_refuses_at_the_second_response_not_after_the_last(
    decoupled_server: ServerProcess,
) -> None:
    """square_int32 asked for 100,000,000 responses: every one was collected before the
    refusal (1.8 GB and no answer within 20 s); the model is stopped at the second."""
    before = tree_memory_mib(decoupled_server.process.pid)
    started = time.monotonic()
    answer = _post(decoupled_server, "/v2/models/square_int32/generate", {"IN": SLOW_READER_COUNT})
    assert answer.status == 400
    assert answer.json()["error"].startswith("generate expects model to produce exactly 1 response")
    assert time.monotonic() - started < 5
    assert tree_memory_mib(decoupled_server.process.pid) - before < MOST_GROWTH_MIB


def test_a_client_that_leaves_stops_its_generation_at_the_next_step(
    decoupled_server: ServerProcess,
) -> None:
    before = int(_statistics(decoupled_server, "char_lstm_step")["inference_count"])
    connection = http.client.HTTPConnection("127.0.0.1", decoupled_server.http_port, timeout=30)
    body = {"text_input": "x", "max_tokens": 1000, "temperature": 1.0}
    connection.request("POST", "/v2/models/char_lstm_generate/generate_stream", json.dumps(body))
    response = connection.getresponse()
    assert response.readline().startswith(b"data: ")  # it is generating
    connection.close()  # the client leaves, 999 characters early
    time.sleep(1.0)
    settled = int(_statistics(decoupled_server, "char_lstm_step")["inference_count"])
    time.sleep(0.5)
    assert int(_statistics(decoupled_server, "char_lstm_step")["inference_count"]) == settled
    assert settled - before < 900
    # and the next generation runs as usual
    assert len(_stream_generation(decoupled_server, "x", 5, 0.0, 2)) == 5


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_client_that_leaves_before_the_first_response_stops_the_model(
    tmp_path: Path, workers: str
) -> None:
    """generate, and generate_stream before its first event, ran with nothing watching the
    connection: a client gone meanwhile left repeat_int32 sleeping out a DELAY of ten
    minutes for nobody, and an unload (and a stop) waited for it."""
    shutil.copytree(MODEL_REPO / "repeat_int32", tmp_path / "repeat_int32")
    server = start_server(
        tmp_path, ["--model-control-mode", "explicit", "--load-model", "*", "--workers", workers]
    )
    body = json.dumps({"IN": [1], "DELAY": [600_000], "WAIT": 0})
    unloads = []
    try:
        for route in ("generate_stream", "generate"):
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=1)
            connection.request("POST", f"/v2/models/repeat_int32/{route}", body)
            with pytest.raises(TimeoutError):
                connection.getresponse()  # nothing comes for ten minutes
            connection.close()  # the client leaves
            time.sleep(0.5)
            started = time.monotonic()
            control = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
            control.unload_model("repeat_int32")
            unloads.append(time.monotonic() - started)
            control.load_model("repeat_int32")
    finally:
        stopped = time.monotonic()
        assert server.stop() == 0
    assert max(unloads) < 5, unloads
    assert time.monotonic() - stopped < 15, "the stop waited for a request nobody waits for"


# repeat and square without ``decoupled: true`` ------------------------------------------
DECOUPLED = "model_transaction_policy { decoupled: true }\n"


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def non_decoupled_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """repeat_int32 and square_int32 without ``decoupled: true``, as Triton's QA serves repeat
    (L0_decoupled's NonDecoupledTest, L0_grpc_state_cleanup): they load, and each call gets
    what Triton's front ends make of their replies."""
    repository = tmp_path_factory.mktemp("not_decoupled")
    for name in ("repeat_int32", "square_int32"):
        shutil.copytree(MODEL_REPO / name, repository / name)
        config = repository / name / "config.pbtxt"
        assert DECOUPLED in config.read_text()
        config.write_text(config.read_text().replace(DECOUPLED, ""))
    server = start_server(repository, ["--workers", request.param])
    yield server
    assert server.stop() == 0


def _repeat(module: Any, values: list[int], delays: list[int]) -> list[Any]:
    return [_tensor(module, "IN", values, "INT32"), _tensor(module, "DELAY", delays, "UINT32"),
            _tensor(module, "WAIT", [0], "UINT32")]  # fmt: skip


@pytest.mark.parametrize("delay", [0, 300])
def test_a_repeat_model_that_is_not_decoupled_answers_infer_once_as_tritons_qa_expects(
    non_decoupled_server: ServerProcess, delay: int
) -> None:
    """L0_decoupled's NonDecoupledTest (shorter delays): IN [1] gets OUT [1] and IDX [0] over
    HTTP, ModelInfer and its async form, though repeat sends the final flag apart from the
    reply. The model was refused at load, asked for ``decoupled: true``."""
    with httpclient.InferenceServerClient(non_decoupled_server.http_url) as http:
        result = http.infer("repeat_int32", _repeat(httpclient, [1], [delay]))
        assert (result.as_numpy("OUT").tolist(), result.as_numpy("IDX").tolist()) == ([1], [0])
    with grpcclient.InferenceServerClient(non_decoupled_server.grpc_url) as grpc_client:
        result = grpc_client.infer("repeat_int32", _repeat(grpcclient, [1], [delay]))
        assert (result.as_numpy("OUT").tolist(), result.as_numpy("IDX").tolist()) == ([1], [0])
        answers: queue.Queue[Result] = queue.Queue()
        grpc_client.async_infer(
            "repeat_int32", _repeat(grpcclient, [1], [delay]),
            callback=lambda result, error: answers.put((result, error)),
        )  # fmt: skip
        result, error = answers.get(timeout=30)
        assert error is None, error
        assert (result.as_numpy("OUT").tolist(), result.as_numpy("IDX").tolist()) == ([1], [0])
        assert grpc_client.is_model_ready("repeat_int32")


@pytest.mark.parametrize(
    ("model", "values", "count"),
    [("repeat_int32", [], 0), ("repeat_int32", [4, 5, 6], 3), ("square_int32", [0], 0),
     ("square_int32", [2], 2)],
)  # fmt: skip
def test_a_call_that_gets_other_than_one_response_is_refused_in_triton_s_words(
    non_decoupled_server: ServerProcess, model: str, values: list[int], count: int
) -> None:
    """Triton's HTTP and ModelInfer handlers count a request's responses up to its final
    flag: none, or more than one, is 500 / INTERNAL in their words. Each protocol's next
    request is answered."""

    def inputs(module: Any) -> list[Any]:
        if model == "square_int32":
            return [_tensor(module, "IN", values, "INT32")]
        return _repeat(module, values, [0] * len(values))

    expected = f"expected a single response, got {count}"
    with httpclient.InferenceServerClient(non_decoupled_server.http_url) as http:
        with pytest.raises(InferenceServerException) as refused:
            http.infer(model, inputs(httpclient))
        assert (refused.value.status(), refused.value.message()) == ("500", expected)
        assert http.infer("square_int32", [_tensor(httpclient, "IN", [1], "INT32")])
    with grpcclient.InferenceServerClient(non_decoupled_server.grpc_url) as grpc_client:
        with pytest.raises(InferenceServerException) as refused:
            grpc_client.infer(model, inputs(grpcclient))
        assert refused.value.status() == "StatusCode.INTERNAL"
        assert refused.value.message() == expected
        assert grpc_client.infer("square_int32", [_tensor(grpcclient, "IN", [1], "INT32")])


def test_a_stream_gets_the_first_response_of_a_model_that_is_not_decoupled(
    non_decoupled_server: ServerProcess,
) -> None:
    """L0_grpc_state_cleanup's test_non_decoupled_streaming_multi_response: of repeat's four
    replies the stream sends the first alone, once the last is made, flagged not final as
    Triton leaves it, and no empty final response though the request asks for one. None at
    all is the error ModelInfer gives (Triton's handler would write a response it never
    made), and the stream goes on."""
    stream = Stream(non_decoupled_server)
    try:
        started = time.monotonic()
        stream.client.async_stream_infer(
            "repeat_int32", _repeat(grpcclient, [100, 101, 102, 103], [0, 0, 0, 300]),
            request_id="m", enable_empty_final_response=True,
        )  # fmt: skip
        result = stream.next()
        assert time.monotonic() - started >= 0.29  # not before the last reply
        assert (result.as_numpy("OUT").tolist(), result.as_numpy("IDX").tolist()) == ([100], [0])
        assert (result.get_response().id, _final(result)) == ("m", False)
        with pytest.raises(queue.Empty):
            stream.results.get(timeout=0.3)
        stream.client.async_stream_infer(
            "square_int32", [_tensor(grpcclient, "IN", [0], "INT32")], request_id="none"
        )
        _, error = stream.results.get(timeout=30)
        assert error is not None
        assert "expected a single response, got 0" in str(error)
        stream.client.async_stream_infer("square_int32", [_tensor(grpcclient, "IN", [1], "INT32")])
        assert stream.next().as_numpy("OUT").tolist() == [1]
    finally:
        stream.close()


def test_generate_reads_every_response_whatever_the_transaction_policy(
    non_decoupled_server: ServerProcess,
) -> None:
    """Triton's generate endpoints do not look at the policy: generate_stream sends each
    reply of a repeat model that is not decoupled, generate refuses two as for a decoupled
    one."""
    body = {"IN": [1, 2], "DELAY": [1, 1], "WAIT": 1}
    events = _post(non_decoupled_server, "/v2/models/repeat_int32/generate_stream", body).events()
    assert [(e["OUT"], e["IDX"]) for e in events] == [(1, 0), (2, 1)]
    answer = _post(non_decoupled_server, "/v2/models/repeat_int32/generate", body)
    assert answer.status == 400
    assert answer.json()["error"].startswith("generate expects model to produce exactly 1 response")
