"""Every example in clients/examples runs against a real server and prints the right answer."""

from __future__ import annotations

import base64
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.integration.server import MODEL_REPO, REPO_ROOT, ServerProcess

EXAMPLES = REPO_ROOT / "clients/examples"
DIGIT = re.compile(r"digit (\d) \(probability ([0-9.]+)\)")


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    """digits_cnn's probabilities for the examples' image, from onnxruntime in-process."""
    image = runpy.run_path(str(EXAMPLES / "client_quickstart.py"))["IMAGE"]
    session = ort.InferenceSession(str(MODEL_REPO / "digits_cnn/1/model.onnx"))
    return np.asarray(session.run(["probabilities"], {"image": image})[0][0])


def _run(command: list[str], server: ServerProcess, *, with_env: bool = True) -> str:
    """Run an example as a user would, the server's address in the environment or not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # grpcurl
    if with_env:
        env.update(BATCHSERVE_HTTP=server.http_url, BATCHSERVE_GRPC=server.grpc_url)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _check_digit(line: str, expected: np.ndarray) -> None:
    match = DIGIT.search(line)
    assert match, line
    assert int(match[1]) == int(expected.argmax())
    assert float(match[2]) == pytest.approx(float(expected.max()), abs=1e-4)


def test_curl(server: ServerProcess, expected: np.ndarray) -> None:
    out = _run(["bash", "clients/examples/curl.sh", server.http_url], server, with_env=False)
    live, ready, metadata, answer = (json.loads(s) for s in out.splitlines() if s[:1] == "{")
    assert live == {"live": True}
    assert ready == {"ready": True}
    assert metadata["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert answer["id"] == "curl-example"
    (output,) = answer["outputs"]
    np.testing.assert_allclose(output["data"], expected, rtol=1e-5, atol=1e-6)


def _sections(out: str) -> list[str]:
    """The output between the example's '#' comment lines."""
    sections, current = [], []
    for line in out.splitlines():
        if line.startswith("#"):
            if current:
                sections.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return [*sections, "\n".join(current)]


def test_grpcurl(server: ServerProcess, expected: np.ndarray) -> None:
    services, ready, metadata, answer = _sections(
        _run(["bash", "clients/examples/grpcurl.sh"], server)
    )
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(services.split())
    assert json.loads(ready) == {"ready": True}
    assert json.loads(metadata)["name"] == "digits_cnn"
    doc = json.loads(answer)
    assert doc["id"] == "grpcurl-example"
    raw = base64.b64decode(doc["raw_output_contents"][0])
    np.testing.assert_allclose(np.frombuffer(raw, "<f4"), expected, rtol=1e-5, atol=1e-6)


def test_tritonclient_http(server: ServerProcess, expected: np.ndarray) -> None:
    command = [sys.executable, "clients/examples/tritonclient_http.py", server.http_url]
    _check_digit(_run(command, server, with_env=False), expected)


def test_tritonclient_grpc(server: ServerProcess, expected: np.ndarray) -> None:
    _check_digit(_run([sys.executable, "clients/examples/tritonclient_grpc.py"], server), expected)


def test_client_quickstart(server: ServerProcess, expected: np.ndarray) -> None:
    out = _run([sys.executable, "clients/examples/client_quickstart.py"], server)
    for url in (f"http://{server.http_url}", f"grpc://{server.grpc_url}"):
        lines = [line for line in out.splitlines() if line.startswith(url)]
        assert f"{url} ready: True" in lines
        assert f"{url} not found: Request for unknown model: 'no_such_model' is not found" in [
            line.split(" (batchserve: ")[0] for line in lines
        ]
        assert f"{url} async: answers to requests ['0', '1', '2', '3']" in lines
        for mode in ("sync", "async"):
            (line,) = [line for line in lines if line.startswith(f"{url} {mode}: digit")]
            _check_digit(line, expected)


def test_java(server: ServerProcess, expected: np.ndarray) -> None:
    """Java's own HttpClient offers h2c with every request, POSTs included: both inferences
    (a sized JSON body, a chunked binary one) must reach the model with their bodies."""
    java = shutil.which("java")
    if java is None:
        pytest.skip("no JDK on this machine (java 11 or later runs the example from source)")
    out = _run([java, "clients/examples/Infer.java"], server)
    ready, as_json, as_binary = _sections(out)
    assert json.loads(ready) == {"ready": True}
    answer = json.loads(as_json)
    assert answer["id"] == "java-example"
    (output,) = answer["outputs"]
    np.testing.assert_allclose(output["data"], expected, rtol=1e-5, atol=1e-6)
    assert as_binary.startswith(f"{server.http_url} HTTP_1_1: ")
    _check_digit(as_binary, expected)


def test_node_grpc(server: ServerProcess, expected: np.ndarray) -> None:
    """@grpc/grpc-js is a second HTTP/2 implementation (Python's grpcio, tritonclient and
    perf_analyzer all use grpc's C core): unary calls, 100 at once on one channel, a stream."""
    node = shutil.which("node")
    if node is None or not (EXAMPLES / "node" / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("no Node.js, or `make integration` could not install the example's packages")
    live, inputs, answer, many, stream = _sections(
        _run([node, "clients/examples/node/infer.js"], server)
    )
    assert live == "true"
    assert json.loads(inputs) == [
        {"shape": ["-1", "1", "8", "8"], "name": "image", "datatype": "FP32"}
    ]
    assert answer.startswith(f"{server.grpc_url} grpc-js: ")
    _check_digit(answer, expected)
    assert many == "100 answered"
    assert stream == 'answers to requests ["0","1","2","3","4"]'
