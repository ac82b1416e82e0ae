"""Triton's own command line: the server started as NVIDIA's Model Analyzer starts
``tritonserver``, and the config completion Triton's flags turn off."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from tests.integration.h2_frames import (
    END_HEADERS,
    HEADERS,
    PREFACE,
    SETTINGS,
    Frame,
    frame,
    grpc_call_headers,
    read_frame,
)
from tests.integration.prometheus import free_port
from tests.integration.server import MODEL_REPO, ServerProcess, start_server

MODEL_ANALYZER_FLAGS = (
    "--model-control-mode", "explicit", "--metrics-interval-ms", "1000",
    "--strict-model-config", "false",
)  # fmt: skip
"""What Model Analyzer 1.58 passes besides the repository and ports (its local mode's command
line, read from the server it launched)."""


def _variant(max_batch_size: int, instances: int) -> str:
    """A config override as Model Analyzer sends one: the repository's config.pbtxt read
    with tritonclient's ModelConfig, as a dict with protobuf's field names, its sweep's
    fields changed, as JSON."""
    text = (MODEL_REPO / "digits_cnn" / "config.pbtxt").read_text()
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    config = json_format.MessageToDict(parsed, preserving_proto_field_name=True)
    config["max_batch_size"] = max_batch_size
    config["instance_group"] = [{"count": instances, "kind": "KIND_CPU"}]
    return json.dumps(config)


def _infer(client: httpclient.InferenceServerClient, batch: int) -> np.ndarray:
    image = httpclient.InferInput("image", [batch, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.ones((batch, 1, 8, 8), dtype=np.float32))
    probabilities: np.ndarray = client.infer("digits_cnn", [image]).as_numpy("probabilities")
    return probabilities


def test_the_server_model_analyzer_launches_serves_each_config_it_loads() -> None:
    server = start_server(extra_args=MODEL_ANALYZER_FLAGS)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for max_batch_size, instances in ((1, 1), (4, 2)):
            client.load_model("digits_cnn", config=_variant(max_batch_size, instances))
            config = client.get_model_config("digits_cnn")
            assert config["max_batch_size"] == max_batch_size
            assert [g["count"] for g in config["instance_group"]] == [instances]
            assert _infer(client, max_batch_size).shape == (max_batch_size, 10)
            with pytest.raises(InferenceServerException, match="batch-size must be <="):
                _infer(client, max_batch_size + 1)
            client.unload_model("digits_cnn")
    finally:
        assert server.stop() == 0


def test_kserves_triton_runtime_command_line_serves() -> None:
    """KServe's Triton runtime's args (``kserve-tritonserver``: the program name, Triton's
    older repository flag, both protocols allowed) after the server's own command, as a
    container runtime appends them to the image's entrypoint; its fixed ports are the
    suite's free ones here."""
    server = start_server(
        extra_args=("tritonserver", f"--model-store={MODEL_REPO}", "--allow-grpc=true",
                    "--allow-http=true"),
    )  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _infer(client, 2).shape == (2, 10)
        assert grpcclient.InferenceServerClient(server.grpc_url).is_server_ready()
    finally:
        assert server.stop() == 0


@pytest.fixture
def incomplete_repo(tmp_path: Path) -> Path:
    """digits_cnn whose config.pbtxt leaves its tensors to the model file."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    (tmp_path / "digits_cnn" / "config.pbtxt").write_text("max_batch_size: 8\n")
    return tmp_path


@pytest.mark.parametrize(
    "flags", [("--disable-auto-complete-config",), ("--strict-model-config", "true")]
)
def test_with_completion_off_a_config_must_list_its_tensors(
    incomplete_repo: Path, flags: tuple[str, ...]
) -> None:
    server = start_server(incomplete_repo, extra_args=("--model-control-mode", "explicit", *flags))
    try:
        for client in (
            httpclient.InferenceServerClient(server.http_url),
            grpcclient.InferenceServerClient(server.grpc_url),
        ):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("digits_cnn")
            assert "digits_cnn/config.pbtxt: it lists no inputs; with " in str(refused.value)
            assert "--disable-auto-complete-config" in str(refused.value)
        complete = (MODEL_REPO / "digits_cnn" / "config.pbtxt").read_text()
        (incomplete_repo / "digits_cnn" / "config.pbtxt").write_text(complete)
        http = httpclient.InferenceServerClient(server.http_url)
        http.load_model("digits_cnn")
        assert _infer(http, 2).shape == (2, 10)
    finally:
        assert server.stop() == 0


def test_with_completion_on_the_same_config_is_completed_from_the_model_file(
    incomplete_repo: Path,
) -> None:
    server = start_server(incomplete_repo, extra_args=("--strict-model-config", "false"))
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        inputs = client.get_model_config("digits_cnn")["input"]
        assert [(i["name"], i["dims"]) for i in inputs] == [("image", [1, 8, 8])]
    finally:
        assert server.stop() == 0


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _grpc_server(address: str) -> str | None:
    """The name (``--id``) of the server answering gRPC at ``address``; None for none."""
    client = grpcclient.InferenceServerClient(address)
    try:
        return str(client.get_server_metadata(client_timeout=2).name)
    except InferenceServerException:
        return None
    finally:
        client.close()


def _http_server(base: str) -> str | None:
    """The name (``--id``) of the server answering HTTP at ``base``; None for none."""
    try:
        answer = httpx.get(f"{base}/v2", timeout=2)
    except httpx.TransportError:
        return None
    return str(answer.json().get("name")) if answer.status_code == 200 else None


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_each_listener_takes_its_own_address(tmp_path: Path, workers: str) -> None:
    """Triton's --grpc-address and --metrics-address on loopback addresses of their own;
    HTTP stays on --host. Each port answers on its address and on no other."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    name = f"addresses-{workers}-{tmp_path.name}"  # another server may hold a port number
    args = ["--host", "127.0.0.1", "--grpc-address", "127.0.0.2", "--id", name,
            "--metrics-address", "127.0.0.3", "--workers", workers]  # fmt: skip
    server = start_server(tmp_path, args)
    try:
        (listening,) = [r for r in server.logs if r.get("message") == "listening"]
        http, grpc, metrics = server.http_port, server.grpc_port, server.metrics_port
        assert _http_server(f"http://127.0.0.1:{http}") == name
        assert _http_server(f"http://127.0.0.2:{http}") != name
        assert _grpc_server(f"127.0.0.2:{grpc}") == name
        assert _grpc_server(f"127.0.0.1:{grpc}") != name
        assert _answers(f"http://127.0.0.3:{metrics}/metrics")
        assert not _answers(f"http://127.0.0.1:{metrics}/metrics")
    finally:
        assert server.stop() == 0
    assert (listening["host"], listening["grpc_host"], listening["metrics_host"]) == (
        "127.0.0.1",
        "127.0.0.2",
        "127.0.0.3",
    )
    # Triton's start-up lines, which scripts written for it wait for, in its order
    started = [str(r["message"]) for r in server.logs if "Service at " in str(r["message"])]
    assert started == [
        f"Started GRPCInferenceService at 127.0.0.2:{grpc}",
        f"Started HTTPService at 127.0.0.1:{http}",
        f"Started Metrics Service at 127.0.0.3:{metrics}",
    ]


@pytest.fixture
def one_broken_model(tmp_path: Path) -> Path:
    """digits_cnn, and a model whose file is not ONNX."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    return tmp_path


def _startup_verdict(server: ServerProcess, timeout: float = 120.0) -> str:
    """The start-up's last word: "server ready" or "server not ready: ..."."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.drain_logs()
        said = [str(r.get("message", "")) for r in server.logs]
        verdicts = [m for m in said if m.startswith(("server ready", "server not ready"))]
        if verdicts:
            return verdicts[0]
        time.sleep(0.1)
    raise TimeoutError("the server did not finish loading its models")


@pytest.mark.parametrize(("strict", "ready"), [("true", 503), ("false", 200)])
def test_strict_readiness_decides_whether_a_failed_model_keeps_the_server_unready(
    one_broken_model: Path, strict: str, ready: int
) -> None:
    """Triton's --strict-readiness: a model that failed keeps the server not ready, unless
    false; the models' own readiness is the same either way."""
    server = start_server(one_broken_model, [f"--strict-readiness={strict}"], wait_ready=False)
    try:
        verdict = _startup_verdict(server)
        assert verdict.startswith("server ready" if ready == 200 else "server not ready")
        url = f"http://{server.http_url}/v2"
        assert httpx.get(f"{url}/health/ready").status_code == ready
        assert httpx.get(f"{url}/models/broken/ready").status_code != 200
        assert httpx.get(f"{url}/models/digits_cnn/ready").status_code == 200
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_ready() is (ready == 200)
    finally:
        assert server.stop() == 0


def test_exit_on_error_stops_a_server_whose_model_fails_at_start(one_broken_model: Path) -> None:
    """Triton's --exit-on-error true: a failed start-up load ends the server, with the status
    of a failed start; false (batchserve's default) serves the others."""
    server = start_server(one_broken_model, ["--exit-on-error=true"], wait_ready=False)
    assert server.process.wait(timeout=120) == 3
    assert server.stop() == 3
    errors = [r["message"] for r in server.logs if r.get("level") == "ERROR"]
    assert errors[-1].startswith("the server did not start: failed to load all models")


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_log_file_takes_every_process_s_logs_and_the_logging_api_names_it(
    tmp_path: Path, workers: str
) -> None:
    """Triton's --log-file (L0_logging): the logs go to the file, stderr stays empty, and
    the logging API reports the file. With workers, each writes its lines there too (they
    used to die at start: the fork server closed the file's descriptor under its file
    object, whose number a worker's link then took)."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    log_file = tmp_path / "server.log"
    http, grpc_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "batchserve.cli", "serve", "--model-repository", str(tmp_path),
        "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", "0",
        "--log-format", "default", f"--log-file={log_file}", "--workers", workers,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while "server ready" not in (log_file.read_text() if log_file.exists() else ""):
            assert process.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _answers(f"http://127.0.0.1:{http}/v2/health/ready")
        # Closed before the stop: the server serves an open connection until its client
        # closes it (Triton's drain), and would wait out its shutdown timeout for these.
        with (
            httpclient.InferenceServerClient(f"127.0.0.1:{http}") as http_client,
            grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc_client,
        ):
            assert http_client.get_log_settings()["log_file"] == str(log_file)
            assert grpc_client.get_log_settings(as_json=True)["settings"]["log_file"] == {
                "string_param": str(log_file)
            }
            assert _infer(http_client, 2).shape == (2, 10)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert stderr == ""
    lines = log_file.read_text().splitlines()
    assert not [line for line in lines if "worker exited" in line]
    pids = {line.split()[2] for line in lines if line[:1] in "IWE" and len(line.split()) > 2}
    assert len(pids) == 1 + (int(workers) if workers != "1" else 0), pids


@pytest.fixture
def two_repositories(tmp_path: Path) -> tuple[Path, Path]:
    """``first`` holds digits_cnn and square_int32, ``second`` repeat_int32 and a second
    square_int32: three names, one of them in both."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root, names in ((first, ("digits_cnn", "square_int32")),
                        (second, ("repeat_int32", "square_int32"))):  # fmt: skip
        for name in names:
            shutil.copytree(MODEL_REPO / name, root / name)
    return first, second


def test_several_repositories_serve_as_one_and_a_duplicate_from_neither(
    two_repositories: tuple[Path, Path],
) -> None:
    """Triton's --model-repository given twice: tritonclient sees the union, a model of
    each repository answers, and the name both hold is listed unavailable with Triton's
    reason, its load refused."""
    first, second = two_repositories
    server = start_server(
        first, ["--model-repository", str(second), "--model-control-mode", "explicit",
                "--load-model", "*"], wait_ready=False,
    )  # fmt: skip
    try:
        assert _startup_verdict(server).startswith("server not ready")  # the duplicate failed
        client = httpclient.InferenceServerClient(server.http_url)
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert sorted(index) == ["digits_cnn", "repeat_int32", "square_int32"]
        assert index["square_int32"] == {
            "name": "square_int32",
            "state": "UNAVAILABLE",
            "reason": "model appears in two or more repositories",
        }
        assert _infer(client, 2).shape == (2, 10)  # the first repository's model
        assert client.is_model_ready("repeat_int32")  # the second's
        assert not client.is_model_ready("square_int32")
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            grpc.load_model("square_int32")
        assert "failed to load 'square_int32', failed to poll from model repository" in str(
            refused.value
        )
        assert "two or more repositories" in str(refused.value)
        shutil.rmtree(second / "square_int32")  # the copy gone, the first one loads
        grpc.load_model("square_int32")
        assert grpc.is_model_ready("square_int32")
        assert grpc.is_server_ready()
    finally:
        assert server.stop() == 0


DATA, END_STREAM = 0x0, 0x1


def _infer_frames(port: int) -> list[Frame]:
    """One ModelInfer call to digits_cnn over raw HTTP/2 from a client that accepts gzip,
    and the frames the server sends until the call ends. Sixteen equal images, so that the
    answer compresses (grpc core sends a message that would grow as it is)."""
    request = service_pb2.ModelInferRequest(model_name="digits_cnn")
    request.inputs.add(name="image", datatype="FP32", shape=[16, 1, 8, 8])
    request.raw_input_contents.append(np.ones(16 * 64, dtype=np.float32).tobytes())
    body = request.SerializeToString()
    accept = b"grpc-accept-encoding", b"identity,deflate,gzip"
    extra = b"\x00" + bytes([len(accept[0])]) + accept[0] + bytes([len(accept[1])]) + accept[1]
    frames: list[Frame] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        headers = grpc_call_headers("/inference.GRPCInferenceService/ModelInfer") + extra
        sock.sendall(frame(HEADERS, END_HEADERS, 1, headers))
        message = b"\x00" + len(body).to_bytes(4, "big") + body
        sock.sendall(frame(DATA, END_STREAM, 1, message))
        while (got := read_frame(sock)) is not None:
            frames.append(got)
            if got.kind == HEADERS and got.flags & END_STREAM:  # the trailers
                break
    return frames


@pytest.mark.parametrize(("level", "compressed"), [("none", 0), ("high", 1)])
def test_grpc_responses_are_compressed_at_tritons_level(level: str, compressed: int) -> None:
    """Triton's --grpc-infer-response-compression-level (its L0_grpc command line, which
    used to stop the start): the response message's compressed flag, as it goes on the
    wire; tritonclient reads the answer either way."""
    server = start_server(extra_args=["--grpc-infer-response-compression-level", level])
    try:
        data = [f for f in _infer_frames(server.grpc_port) if f.kind == DATA and f.payload]
        assert data
        assert data[0].payload[0] == compressed
        client = grpcclient.InferenceServerClient(server.grpc_url)
        image = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(np.ones((1, 1, 8, 8), dtype=np.float32))
        assert client.infer("digits_cnn", [image]).as_numpy("probabilities").shape == (1, 10)
    finally:
        assert server.stop() == 0


def test_the_server_id_is_the_name_tritonclient_reads_over_both_protocols() -> None:
    """Triton's --id: its server metadata's name."""
    server = start_server(extra_args=["--id", "inference-a"])
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.get_server_metadata()["name"] == "inference-a"
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.get_server_metadata().name == "inference-a"
    finally:
        assert server.stop() == 0


def _rate_limited_copy(repo: Path, name: str, needs: int, priority: int) -> None:
    """digits_cnn under another name, its one instance needing ``needs`` of "slots"."""
    shutil.copytree(
        MODEL_REPO / "digits_cnn", repo / name, ignore=shutil.ignore_patterns("configs")
    )
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace('name: "digits_cnn"', f'name: "{name}"')
    config.write_text(
        text + "instance_group [{ kind: KIND_CPU count: 1 rate_limiter { "
        f'resources [{{ name: "slots" count: {needs} }}] priority: {priority} }} }}]\n'
    )


def test_rate_limited_models_serve_and_one_needing_too_much_is_refused(tmp_path: Path) -> None:
    """Triton's L0_rate_limiter command line: --rate-limit execution_count with a resource
    count; the model needing more than the server has is refused in Triton's words, the
    others answer concurrent clients over both protocols."""
    for name, needs, priority in (("first", 2, 1), ("second", 2, 2), ("greedy", 4, 1)):
        _rate_limited_copy(tmp_path, name, needs, priority)
    server = start_server(
        tmp_path, ["--rate-limit=execution_count", "--rate-limit-resource=slots:2"],
        wait_ready=False,
    )  # fmt: skip
    try:
        assert _startup_verdict(server).startswith("server not ready")  # greedy failed
        client = httpclient.InferenceServerClient(server.http_url)
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["greedy"]["state"] == "UNAVAILABLE"
        assert (
            'Resource count for "slots" is limited to 2 which will prevent scheduling of one '
            "or more model instances, the minimum required count is 4"
        ) in index["greedy"]["reason"]
        image = np.ones((2, 1, 8, 8), dtype=np.float32)

        def ask(call: int) -> np.ndarray:
            model = ("first", "second")[call % 2]
            if call % 3:  # a client per thread: tritonclient's HTTP client is not shared
                http = httpclient.InferenceServerClient(server.http_url)
                tensor = httpclient.InferInput("image", list(image.shape), "FP32")
                tensor.set_data_from_numpy(image)
                return http.infer(model, [tensor]).as_numpy("probabilities")
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            return grpc.infer(model, [tensor]).as_numpy("probabilities")

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(48)))
        for answer in answers:
            np.testing.assert_allclose(answer, answers[0], rtol=1e-5)
            np.testing.assert_allclose(answer.sum(axis=1), 1.0, rtol=1e-5)
        stats = client.get_inference_statistics()["model_stats"]
        served = {entry["name"]: int(entry["inference_count"]) for entry in stats}
        assert served["first"] == served["second"] == 48  # 24 requests of 2 rows each
    finally:
        assert server.stop() == 0


def _serve_args(repo: Path, http: int, grpc: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "batchserve.cli", "serve", "--model-repository", str(repo),
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "0",
        "--log-format", "json", *extra,
    ]  # fmt: skip


def test_ports_another_server_holds_stop_the_start_unless_shared(tmp_path: Path) -> None:
    """Triton's L0_socket: a second server on the ports of a running one does not start,
    even where both run several workers (whose sockets let each other share a port), and
    does with --reuse-http-port and --reuse-grpc-port true; one server's HTTP and gRPC on
    one port is refused before anything starts, in Triton's words."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    http, grpc = free_port(), free_port()
    same = subprocess.run(
        _serve_args(tmp_path, http, http), capture_output=True, text=True, timeout=120
    )
    assert same.returncode == 2
    assert (
        "The server cannot listen to HTTP requests and GRPC requests at the same address and "
        f"port 127.0.0.1:{http}"
    ) in same.stderr
    first = start_server(tmp_path, ["--http-port", str(http), "--grpc-port", str(grpc),
                                    "--workers", "2"])  # fmt: skip
    try:
        second = subprocess.run(
            _serve_args(tmp_path, http, grpc, "--workers", "2"),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 3
        assert f"cannot serve HTTP on 127.0.0.1:{http}" in second.stderr
        assert "--reuse-http-port true shares it" in second.stderr
        shared = start_server(tmp_path, ["--http-port", str(http), "--grpc-port", str(grpc),
                                         "--reuse-http-port", "true",
                                         "--reuse-grpc-port", "true"])  # fmt: skip
        try:
            assert _infer(httpclient.InferenceServerClient(f"127.0.0.1:{http}"), 1).shape == (
                1,
                10,
            )
        finally:
            assert shared.stop() == 0
    finally:
        assert first.stop() == 0


def _refuses_connections(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) != 0


@contextlib.contextmanager
def _held_free_port() -> Iterator[int]:
    """A free port the test keeps bound, not listening: connections to it are refused, no
    other test's server can take it meanwhile (one that did read as this server listening
    there), and a server that tried to serve on it could not start."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


def _started(server: ServerProcess) -> tuple[bool, bool]:
    """Whether the server logged Triton's start line for HTTP and for gRPC."""
    messages = [str(record.get("message")) for record in server.logs]

    def logged(service: str) -> bool:
        return any(f"Started {service} at" in message for message in messages)

    return logged("HTTPService"), logged("GRPCInferenceService")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_allow_http_false_serves_grpc_alone_and_leaves_the_http_port_free(
    tmp_path: Path, workers: str
) -> None:
    """Triton's L0_socket: with --allow-http 0 nothing listens on the HTTP port (which may
    then even be the gRPC one, or no port at all), gRPC answers inference and health, the
    metrics port serves, and SIGTERM drains to exit 0."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    grpc_port = free_port()
    with _held_free_port() as unused:
        for http_port in (unused, grpc_port, -47):
            server = start_server(
                tmp_path,
                ["--allow-http", "0", "--http-port", str(http_port),
                 "--grpc-port", str(grpc_port)],
                extra_env={"BATCHSERVE_WORKERS": workers},
            )  # fmt: skip
            try:
                assert server.http_port == 0
                assert _started(server) == (False, True)
                if 0 < http_port != grpc_port:
                    assert _refuses_connections(http_port)
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
                assert client.is_server_ready()
                image = grpcclient.InferInput("image", [2, 1, 8, 8], "FP32")
                image.set_data_from_numpy(np.ones((2, 1, 8, 8), dtype=np.float32))
                answer = client.infer("digits_cnn", [image]).as_numpy("probabilities")
                np.testing.assert_allclose(answer.sum(axis=1), 1.0, rtol=1e-5)
                metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
                success = 'nv_inference_request_success{model="digits_cnn",version="1"} 1\n'
                assert success in metrics.text
                client.close()
            finally:
                assert server.stop() == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_allow_grpc_false_serves_http_alone_and_leaves_the_grpc_port_free(
    tmp_path: Path, workers: str
) -> None:
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    http_port = free_port()
    with _held_free_port() as unused:
        for grpc_port in (unused, http_port):
            server = start_server(
                tmp_path,
                ["--allow-grpc", "false", "--http-port", str(http_port),
                 "--grpc-port", str(grpc_port)],
                extra_env={"BATCHSERVE_WORKERS": workers},
            )  # fmt: skip
            try:
                assert server.grpc_port == 0
                assert _started(server) == (True, False)
                if grpc_port != http_port:
                    assert _refuses_connections(grpc_port)
                client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
                assert client.is_server_ready()
                assert _infer(client, 3).shape == (3, 10)
                client.close()
            finally:
                assert server.stop() == 0


def test_with_neither_protocol_the_server_loads_its_models_and_serves_metrics(
    tmp_path: Path,
) -> None:
    """Both false, as Triton allows (its other front ends, or none, serve): the models load,
    the metrics port answers, and SIGTERM still ends it cleanly."""
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    server = start_server(tmp_path, ["--allow-http", "false", "--allow-grpc", "false"])
    try:
        assert (server.http_port, server.grpc_port) == (0, 0)
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        assert 'batchserve_model_state{model="digits_cnn",state="READY"} 1.0' in text
    finally:
        assert server.stop() == 0
